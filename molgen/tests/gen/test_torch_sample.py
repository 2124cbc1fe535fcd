"""The PyTorch peer sampler (molgen.torch_sample) that speed tables
compare molgen against: its KV-cache step gives the logits of the whole
prefix re-run (float64, fresh weights, every position to ctx_len), and
sampling at temperature 1 with and without the cache, from the same
generator, draws the same molecules."""

import pytest

torch = pytest.importorskip("torch")
from molgen import torch_model as tm  # noqa: E402
from molgen import torch_sample as ts  # noqa: E402


def fresh(ctx=20):
    torch.manual_seed(3)
    model = tm.MolGPT(tm.Config(2, 32, 4, ctx, 12, 0.0)).double()
    with torch.no_grad():  # larger weights than the init: peaked attention, varied logits
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model.eval()


def test_kv_step_equals_the_prefix_rerun():
    model = fresh()
    ids = torch.randint(3, 12, (5, 20))
    ids[:, 0] = tm.BOS
    cache = [[] for _ in model.blocks]
    worst = 0.0
    with torch.no_grad():
        full = model.logits(ids)
        for pos in range(20):
            got = ts.kv_step(model, ids[:, pos], pos, cache)
            worst = max(worst, float((got - full[:, pos]).abs().max()))
    assert worst < 1e-10, worst
    assert float(full.std()) > 0.5  # the check compares logits that vary


def test_kv_and_naive_sample_alike():
    model = fresh()
    out = {}
    for kv in (False, True):
        gen = torch.Generator().manual_seed(0)
        out[kv] = ts.sample(model, 12, 4, 1.0, 0, 1.0, gen, kv=kv)
    assert out[True] == out[False]
    assert len({tuple(m) for m in out[True][0]}) > 6  # different molecules, not one repeated
