"""molgen bench --json's mfu: the FLOP rate it reports is its tokens/s times
the count stated in bench.h, with the matmul weights counted on the PyTorch
twin (molgen.torch_model: every nn.Linear weight and the attention's
in_proj_weight) and the causally visible (query, key) pairs counted from a
torch.tril mask; mfu is that rate over the FMA peak it measured."""
import json
import os
import subprocess

import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")

HERE = os.path.dirname(os.path.abspath(__file__))

from molgen_bin import molgen_binary  # noqa: E402
from molgen.torch_model import Config, MolGPT  # noqa: E402

ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")


def twin_matmul_weights(cfg):
    model = MolGPT(cfg)
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    n += sum(m.in_proj_weight.numel() for m in model.modules()
             if isinstance(m, torch.nn.MultiheadAttention))
    return n


@pytest.mark.parametrize("molgpt", [False, True])
def test_mfu_flop_count(molgpt):
    ctx = 12
    args = [molgen_binary(), "bench", "--threads", "1", "--runs", "1", "--warmup", "0",
            "--steps", "1", "--batch", "2", "--ctx", str(ctx), "--no-sample", "--json"]
    if molgpt:
        args.append("--molgpt")
    p = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    tr = j["train"]
    cfg = Config(j["n_layer"], j["d_model"], j["n_head"], j["ctx_len"], j["vocab_size"])
    pairs_per_row = int(torch.tril(torch.ones(ctx, ctx)).sum())  # random full rows: ctx positions
    flops_per_token = (6 * twin_matmul_weights(cfg)
                       + 12 * cfg.n_layer * cfg.d_model * pairs_per_row / ctx)
    # one run: the FLOP rate and tokens/s come from the same interval
    assert tr["gflops"] * 1e9 == pytest.approx(tr["tokens_per_s"] * flops_per_token, rel=1e-3)
    assert tr["mfu"] == pytest.approx(tr["gflops"] / tr["peak_gflops"], rel=1e-3)
    assert 0 < tr["mfu"] < 1.5 and tr["peak_isa"] in ("avx512", "avx2", "scalar")
