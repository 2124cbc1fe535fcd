"""molgen's C model vs the same model in PyTorch (molgen.torch_model).

`molgen debug-grads` builds a model in C (GPT-2 init, then every parameter
perturbed by U(-p/2, p/2) so every path carries signal), runs one
forward/backward on a random batch with padding, and writes the parameters,
gradients, batch and loss. PyTorch loads the same weights in float64, runs
the batch, and autograd gives the oracle. Dropout is 0 (PyTorch's dropout
RNG is not libattn's Philox).

Criteria: |loss_C - loss_torch| / loss_torch <= 1e-5, and for EVERY parameter
tensor max|g_C - g_torch| / max|g_torch| <= 1e-4 (normwise relative error).
Measured (fp32 C vs fp64 torch, 4 configurations up to 4 layers x d 128):
loss relative error <= 5.3e-8, worst gradient tensor 7.4e-7 (LayerNorm and
in_proj weights); run with -s to see every configuration's worst tensor.

The molgen binary: $MOLGEN_BIN, else <dir of $ATTN_LIBRARY>/molgen/molgen,
else build/molgen/molgen.
"""
import json
import os
import subprocess

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MOLGEN_DIR = os.path.dirname(os.path.dirname(HERE))
REPO = os.path.dirname(MOLGEN_DIR)

torch = pytest.importorskip("torch")
from molgen import torch_model as tm  # noqa: E402

from molgen_bin import molgen_binary  # noqa: E402

LOSS_TOL = 1e-5
GRAD_TOL = 1e-4


CONFIGS = [
    # layers, d_model, heads, ctx_len, vocab, batch, perturb, seed
    (2, 16, 2, 8, 10, 3, 0.6, 1),
    (1, 12, 3, 6, 5, 4, 0.6, 2),
    (3, 32, 4, 12, 26, 5, 0.3, 3),
    (4, 128, 4, 20, 26, 4, 0.1, 4),
    (2, 16, 2, 10, 12, 21, 0.6, 5),  # 3 attention chunks of 8 rows (model.c)
]


def compare(tmp_path, layers, d, heads, ctx, vocab, batch, perturb, seed):
    out = str(tmp_path / "grads.safetensors")
    cmd = [molgen_binary(), "debug-grads", "--out", out, "--layers", str(layers), "--d-model", str(d),
           "--heads", str(heads), "--ctx-len", str(ctx), "--vocab", str(vocab), "--batch", str(batch),
           "--perturb", str(perturb), "--seed", str(seed)]
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   env=dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell")))
    tensors, meta = tm.load_safetensors(out)
    cfg = tm.Config.from_json(meta["config"])
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.ctx_len, cfg.vocab_size) == (layers, d, heads, ctx, vocab)
    model = tm.MolGPT(cfg).double()
    names = [n for n, _ in model.named_parameters()]
    # every C tensor has a torch twin with the same shape, and vice versa
    c_names = sorted(k for k in tensors if not k.startswith(("grad.", "batch.")))
    assert c_names == sorted(names)
    model.load_state_dict({n: torch.from_numpy(tensors[n].astype(np.float64)) for n in names})
    model.train()  # dropout is 0: train == eval
    ids = torch.from_numpy(tensors["batch.ids"].astype(np.int64))
    lengths = torch.from_numpy(tensors["batch.lengths"].astype(np.int64))
    loss, n = model.loss(ids, lengths)
    loss.backward()
    assert n == int(meta["ntok"])
    c_loss = float(meta["loss"])
    loss_err = abs(c_loss - loss.item()) / abs(loss.item())
    worst = (0.0, "")
    rows = []
    for name, p in model.named_parameters():
        g_t = p.grad.numpy()
        g_c = tensors["grad." + name].astype(np.float64)
        assert g_c.shape == g_t.shape, name
        scale = np.abs(g_t).max()
        assert scale > 0, "%s: zero gradient in torch" % name
        err = np.abs(g_c - g_t).max() / scale
        rows.append((name, err))
        if err > worst[0]:
            worst = (err, name)
    label = "%d layers, d %d, %d heads, ctx %d, V %d" % (layers, d, heads, ctx, vocab)
    print("\n%s: loss %.6f (C) vs %.6f (torch), rel %.2e; worst gradient %s %.2e"
          % (label, c_loss, loss.item(), loss_err, worst[1], worst[0]))
    assert loss_err <= LOSS_TOL, "loss: C %.9g torch %.9g" % (c_loss, loss.item())
    bad = [(nm, e) for nm, e in rows if e > GRAD_TOL]
    assert not bad, "%s: gradients off (max|dg|/max|g|): %s" % (label, bad)
    return loss_err, worst


@pytest.mark.parametrize("layers,d,heads,ctx,vocab,batch,perturb,seed", CONFIGS)
def test_loss_and_gradients_match_torch(tmp_path, layers, d, heads, ctx, vocab, batch, perturb, seed):
    compare(tmp_path, layers, d, heads, ctx, vocab, batch, perturb, seed)


def test_trained_checkpoint_matches_torch(tmp_path):
    """A checkpoint written by `molgen train` (40 steps on 400 molecules)
    loads into the torch model by name (config and vocab from its metadata),
    and its loss and gradients on a random batch match C's."""
    data = os.environ.get("MOLGEN_SHARED_DATA", os.path.join(REPO, "..", "shared", "data"))
    src = os.path.join(data, "moses_train5k.smi")
    if not os.path.exists(src):
        pytest.skip("no %s" % src)
    smi = tm.read_smiles(src, 400)
    small = tmp_path / "small.smi"
    small.write_text("\n".join(smi) + "\n")
    ckpt = str(tmp_path / "m.safetensors")
    r = subprocess.run([molgen_binary(), "train", "--data", str(small), "--steps", "40", "--out", ckpt,
                        "--layers", "2", "--d-model", "32", "--heads", "2", "--batch-size", "16",
                        "--lr", "3e-3", "--warmup", "5", "--quiet", "--val-every", "0"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["step"] == 40 and summary["val_loss"] < summary["first_val_loss"] - 0.5, summary

    model, vocab = tm.load_model(ckpt, torch.float64, raw=True)  # debug-grads' weights
    assert vocab[:3] == tm.SPECIALS and len(vocab) == model.cfg.vocab_size
    # the torch tokenizer + this vocab encode the data (same regex as C)
    ids, lengths = tm.encode(smi[:50], vocab, model.cfg.ctx_len + 1)
    assert (lengths >= 3).all()

    out = str(tmp_path / "g.safetensors")
    subprocess.run([molgen_binary(), "debug-grads", "--model", ckpt, "--out", out, "--batch", "6"],
                   check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tensors, meta = tm.load_safetensors(out)
    model.train()
    loss, _ = model.loss(torch.from_numpy(tensors["batch.ids"].astype(np.int64)),
                         torch.from_numpy(tensors["batch.lengths"].astype(np.int64)))
    loss.backward()
    assert abs(float(meta["loss"]) - loss.item()) <= LOSS_TOL * loss.item()
    for name, p in model.named_parameters():
        g_t = p.grad.numpy()
        scale = np.abs(g_t).max()
        if scale == 0:  # e.g. embedding rows of tokens absent from the batch only
            continue
        err = np.abs(tensors["grad." + name] - g_t).max() / scale
        assert err <= GRAD_TOL, (name, err)
