"""`molgen train --label-smoothing X`, the setting added as one line of
molgen/train/train_settings.h.

1. The loss and every gradient against PyTorch's own
   F.cross_entropy(label_smoothing=X) on the float64 twin of the model
   (molgen.torch_model), through `molgen debug-grads --label-smoothing`,
   with test_model_torch.py's tolerances (loss 1e-5 relative, every gradient
   tensor 1e-4 normwise).
2. The checkpoint keeps it: a run stopped half way and resumed without the
   option continues with it, bit for bit; and a checkpoint whose "train"
   metadata lacks the key (written before the setting existed) resumes with
   0, bit for bit.
3. It acts: 0.2 trains other weights than 0.

The molgen binary: $MOLGEN_BIN, else <dir of $ATTN_LIBRARY>/molgen/molgen,
else build/molgen/molgen."""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MOLGEN_DIR = os.path.dirname(os.path.dirname(HERE))
REPO = os.path.dirname(MOLGEN_DIR)

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from molgen import torch_model as tm  # noqa: E402

from molgen_bin import molgen_binary  # noqa: E402

LOSS_TOL = 1e-5
GRAD_TOL = 1e-4
DATA20K = os.path.join(REPO, "data", "moses_20k.smi")


def run(args):
    p = subprocess.run([molgen_binary()] + args, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell")))
    assert p.returncode == 0, p.stderr
    return p


@pytest.mark.parametrize("eps,layers,d,heads,ctx,vocab,batch,seed", [
    (0.1, 2, 16, 2, 8, 10, 3, 1),
    (0.3, 3, 32, 4, 12, 26, 5, 3),
    (0.05, 2, 16, 2, 10, 12, 21, 5),
])
def test_matches_torch_cross_entropy(tmp_path, eps, layers, d, heads, ctx, vocab, batch, seed):
    out = str(tmp_path / "grads.safetensors")
    run(["debug-grads", "--out", out, "--layers", str(layers), "--d-model", str(d), "--heads", str(heads),
         "--ctx-len", str(ctx), "--vocab", str(vocab), "--batch", str(batch), "--seed", str(seed),
         "--label-smoothing", str(eps)])
    tensors, meta = tm.load_safetensors(out)
    assert float(meta["label_smoothing"]) == pytest.approx(eps)
    cfg = tm.Config.from_json(meta["config"])
    model = tm.MolGPT(cfg).double()
    names = [n for n, _ in model.named_parameters()]
    model.load_state_dict({n: torch.from_numpy(tensors[n].astype(np.float64)) for n in names})
    ids = torch.from_numpy(tensors["batch.ids"].astype(np.int64))
    lengths = torch.from_numpy(tensors["batch.lengths"].astype(np.int64))
    inp, tgt = ids[:, :-1], ids[:, 1:]
    kl = lengths - 1
    logits = model.logits(inp, kl)
    mask = torch.arange(inp.shape[1])[None, :] < kl[:, None]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none",
                         label_smoothing=eps).reshape(tgt.shape)
    loss = (ce * mask).sum() / mask.sum()
    loss.backward()
    assert int(mask.sum()) == int(meta["ntok"])
    c_loss = float(meta["loss"])
    loss_err = abs(c_loss - loss.item()) / abs(loss.item())
    worst = max((np.abs(tensors["grad." + n].astype(np.float64) - p.grad.numpy()).max() / np.abs(p.grad.numpy()).max(), n)
                for n, p in model.named_parameters())
    print("\nlabel smoothing %g: loss %.6f (C) vs %.6f (torch), rel %.2e; worst gradient %s %.2e"
          % (eps, c_loss, loss.item(), loss_err, worst[1], worst[0]))
    assert loss_err <= LOSS_TOL
    assert worst[0] <= GRAD_TOL, worst
    # and it is not the plain cross-entropy
    plain = (F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
             .reshape(tgt.shape) * mask).sum() / mask.sum()
    assert abs(plain.item() - c_loss) > 10 * LOSS_TOL * abs(c_loss)


def tensors_and_train(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__")
    buf = raw[8 + n:]
    return {k: buf[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in hdr.items()}, json.loads(meta["train"])


def rewrite_train(path, out, drop_key):
    """path with "train" metadata lacking drop_key (and no checksum table,
    which would still be valid: only metadata changes)."""
    raw = bytearray(open(path, "rb").read())
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    train = json.loads(hdr["__metadata__"]["train"])
    del train[drop_key]
    hdr["__metadata__"]["train"] = json.dumps(train)
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    open(out, "wb").write(struct.pack("<Q", len(text)) + text + bytes(raw[8 + n:]))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "mols.smi"
    with open(DATA20K) as f:
        path.write_text("".join(next(f) for _ in range(400)))
    return str(path)


TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--batch-size", "8", "--val-every", "5",
        "--val-max", "20", "--ckpt-every", "4", "--threads", "1", "--seed", "3", "--dropout", "0.1",
        "--steps", "12", "--quiet"]


def test_checkpoint_keeps_it_and_older_ones_resume(data, tmp_path):
    t = lambda name: str(tmp_path / name)  # noqa: E731
    run(["train", "--data", data, "--out", t("straight.st"), "--label-smoothing", "0.2"] + TINY)
    run(["train", "--data", data, "--out", t("half.st"), "--label-smoothing", "0.2", "--stop-after", "5"] + TINY)
    _, train = tensors_and_train(t("half.st"))
    assert train["label_smoothing"] == pytest.approx(0.2) and train["step"] == 5
    run(["train", "--resume", t("half.st"), "--out", t("resumed.st"), "--threads", "1", "--quiet"])
    a, _ = tensors_and_train(t("straight.st"))
    b, _ = tensors_and_train(t("resumed.st"))
    assert a == b, "resume without --label-smoothing did not continue with the checkpoint's 0.2"

    # a checkpoint written before the setting existed: no key, resumes with 0
    run(["train", "--data", data, "--out", t("plain.st")] + TINY)
    run(["train", "--data", data, "--out", t("plain_half.st"), "--stop-after", "5"] + TINY)
    rewrite_train(t("plain_half.st"), t("old_half.st"), "label_smoothing")
    _, old = tensors_and_train(t("old_half.st"))
    assert "label_smoothing" not in old
    run(["train", "--resume", t("old_half.st"), "--out", t("old_resumed.st"), "--threads", "1", "--quiet"])
    p, _ = tensors_and_train(t("plain.st"))
    q, train_q = tensors_and_train(t("old_resumed.st"))
    assert p == q, "an old checkpoint did not resume bit for bit with label smoothing 0"
    assert train_q["label_smoothing"] == 0

    # and the setting acts
    assert a["tok_emb.weight"] != p["tok_emb.weight"]
