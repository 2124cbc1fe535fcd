"""molgen score --dtype bf16 on 50 molecules of the shipped model.

The bound: with both operands of a product rounded to bf16 (unit roundoff
u = 2^-8), each product's output moves by at most (1 + u)^2 - 1 ~ 2u of its
sum of |terms|; LayerNorm re-normalises every block's input, so the
per-molecule NLL inherits a relative change of that order rather than a
compounded one: |nll_bf16 - nll_fp32| <= 2u nll_fp32 = 2^-7 nll_fp32.

The float64 twin that rounds the same operands (test_bf16_train_twin.py)
measures the size of that change independently: its |nll_rounded -
nll_float64| must obey the same bound, and molgen's mean change must be of
the same size (within 2x): the twin cannot match molgen molecule by
molecule, as its operands round across bf16 boundaries where molgen's fp32
ones do not (about 1,300 such operands in these 50 forwards; see that
file's docstring).

fp32 is unchanged: --dtype fp32 gives the default's bytes (test_score.py and
test_score.c check those against the training loss and the fp32 twin).
Measured: molgen max 2.0e-3, twin max 2.0e-3 relative; means ~4e-4."""
import csv
import io
import os
import subprocess

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
MODEL = os.path.join(REPO, "models", "molgen-moses.safetensors")
DATA = os.path.join(REPO, "data", "moses_20k.smi")

from molgen_bin import load_file, molgen_binary  # noqa: E402

BOUND = 2.0 ** -7


def smiles(n):
    with open(DATA) as f:
        return [line.split()[0] for line in f if line.strip()][:n]


def score(path, *extra):
    p = subprocess.run([molgen_binary(), "score", "--model", MODEL, "--smiles", str(path),
                        "--quiet"] + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.returncode == 0, p.stderr
    return p.stdout


def nlls(out):
    rows = list(csv.DictReader(io.StringIO(out.decode())))
    assert all(r["status"] == "ok" for r in rows)
    return np.array([float(r["nll"]) for r in rows])


def bf16_twin_module():
    """The bf16-rounded PyTorch twin (twin(cfg, rounded)) of
    train/test_bf16_train_twin.py, loaded from its file: that folder is not
    on sys.path when this file runs alone."""
    return load_file("bf16_train_twin", os.path.join(HERE, "..", "train", "test_bf16_train_twin.py"))


def test_bf16_nll_within_bf16_rounding_of_fp32(tmp_path):
    torch = pytest.importorskip("torch")
    twin_mod = bf16_twin_module()
    from molgen import torch_model as tm
    smi = smiles(50)
    path = tmp_path / "in.smi"
    path.write_text("\n".join(smi) + "\n")
    default = score(path)
    assert score(path, "--dtype", "fp32") == default  # fp32: the same bytes
    c32, cbf = nlls(default), nlls(score(path, "--dtype", "bf16"))
    rel = np.abs(cbf - c32) / c32
    assert rel.max() <= BOUND, rel.max()
    assert (cbf != c32).mean() > 0.9  # bf16 is in effect

    tensors, meta = tm.load_safetensors(MODEL)
    cfg = tm.Config.from_json(meta["config"])
    vocab = __import__("json").loads(meta["vocab"])
    ref = {}
    for rounded in (True, False):
        m = twin_mod.twin(cfg, rounded)
        m.load_state_dict({n: torch.from_numpy(tensors[n].astype(np.float64))
                           for n, _ in m.named_parameters()})
        ref[rounded] = np.array(tm.molecule_nll(m, vocab, smi)[0])
    t_rel = np.abs(ref[True] - ref[False]) / ref[False]
    print("\nbf16 vs fp32 NLL, relative: molgen max %.2e mean %.2e; twin max %.2e mean %.2e"
          % (rel.max(), rel.mean(), t_rel.max(), t_rel.mean()))
    assert t_rel.max() <= BOUND
    assert 0.5 <= rel.mean() / t_rel.mean() <= 2.0, (rel.mean(), t_rel.mean())


def test_score_dtype_refused(tmp_path):
    p = subprocess.run([molgen_binary(), "score", "--model", MODEL, "--smiles", "-", "--dtype",
                        "fp16"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 2 and "bad value 'fp16' for --dtype" in p.stderr, p.stderr
