"""tools/train_prior_torch.py (PyTorch training of a molgen prior, used for
the ZINC prior on a lent GPU) against molgen itself:

- its fused-SDPA forward equals molgen.torch_model's masked forward on every
  real position (the two formulations: causal-only vs causal + key padding);
- its vocabulary is the one `molgen train` builds from the same data;
- the file it writes is a molgen model: `molgen score`'s per-molecule NLL
  (the C forward) equals PyTorch's on it, and `sample` and `train --init`
  take it;
- a run cut short keeps its best validation model (the file is written at
  every improvement).
"""
import csv
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from molgen import torch_model as tm  # noqa: E402
from molgen_bin import molgen_binary  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TOOL = os.path.join(REPO, "tools", "train_prior_torch.py")
sys.path.insert(0, os.path.join(REPO, "tools"))
import train_prior_torch as tp  # noqa: E402

ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(REPO, "python"))


def data_file(tmp_path, n=240):
    """n ZINC-like molecules with stereo and charges (drugs30 first, then
    moses_20k), so the vocabulary has bracket atoms."""
    smi = []
    for name in ("drugs30.smi", "moses_20k.smi"):
        with open(os.path.join(REPO, "data", name)) as f:
            smi += [ln.split()[0] for ln in f if ln.split() and not ln.startswith("#")]
    p = tmp_path / "mols.smi"
    p.write_text("\n".join(smi[:n]) + "\n")
    return str(p), smi[:n]


def train(tmp_path, data, extra=()):
    out = str(tmp_path / "prior.safetensors")
    cmd = [sys.executable, TOOL, "--data", data, "--out", out, "--layers", "2", "--d-model", "32",
           "--heads", "4", "--ctx-len", "120", "--batch", "16", "--warmup", "2", "--time-limit", "600",
           "--val-every", "600", "--val-frac", "0.1", "--device", "cpu", *extra]
    r = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 0, r.stderr
    return out, r.stderr


def test_fast_forward_equals_masked_forward():
    torch.manual_seed(0)
    cfg = tm.Config(2, 32, 4, 40, 30, 0.0)
    model = tm.MolGPT(cfg).double()
    with torch.no_grad():  # non-trivial LayerNorm and biases
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    lengths = torch.tensor([12, 30, 5, 40])
    ids = torch.randint(3, 30, (4, 40))
    model.eval()
    with torch.no_grad():
        a = model.logits(ids, lengths)
        b = tp.fast_logits(model, ids, 0.0, False)
    real = torch.arange(40)[None, :] < lengths[:, None]
    err = (a - b).abs()[real].max().item()
    assert err <= 1e-12 * max(1.0, a.abs().max().item()), err
    # a padded position's logits differ (it sees no key padding): the
    # comparison above is over the positions that matter, and they matter
    assert (a - b).abs()[~real].max().item() > 0


def test_vocab_is_molgen_trains(tmp_path):
    data, _ = data_file(tmp_path)
    out, _ = train(tmp_path, data, ["--max-steps", "1"])
    _, meta = tm.load_safetensors(out)
    ref = str(tmp_path / "c.safetensors")
    subprocess.run([molgen_binary(), "train", "--data", data, "--out", ref, "--steps", "1",
                    "--layers", "1", "--d-model", "16", "--heads", "2", "--ctx-len", "120",
                    "--threads", "1", "--quiet"], env=ENV, check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, cmeta = tm.load_safetensors(ref)
    assert json.loads(meta["vocab"]) == json.loads(cmeta["vocab"])
    assert "[C@@H]" in json.loads(meta["vocab"])


def test_output_is_a_molgen_model(tmp_path):
    data, smi = data_file(tmp_path)
    out, err = train(tmp_path, data, ["--max-steps", "4"])
    assert "step 4: train loss" in err and "best val loss" in err
    info = json.loads(tm.load_safetensors(out)[1]["torch_train"])
    assert info["step"] == 4 and info["split_seed"] == 1
    # molgen's C forward (score) against PyTorch's on the written file
    test = tmp_path / "t.smi"
    test.write_text("\n".join(smi[:40]) + "\n")
    csv_path = tmp_path / "s.csv"
    subprocess.run([molgen_binary(), "score", "--model", out, "--smiles", str(test), "--threads", "1",
                    "--quiet", "--out", str(csv_path)], env=ENV, check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    rows = list(csv.DictReader(open(csv_path)))
    model, vocab = tm.load_model(out, torch.float64)
    nll, ntok = tm.molecule_nll(model, vocab, smi[:40])
    assert [r["status"] for r in rows] == ["ok"] * 40
    for r, x, n in zip(rows, nll, ntok):
        assert int(r["tokens"]) == n
        assert abs(float(r["nll"]) - x) <= 1e-4 * x, (r, x)
    s = subprocess.run([molgen_binary(), "sample", "--model", out, "-n", "8", "--seed", "1",
                        "--threads", "1", "--out", str(tmp_path / "x.smi")], env=ENV,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert s.returncode == 0, s.stderr
    assert len((tmp_path / "x.smi").read_text().splitlines()) == 8
    t = subprocess.run([molgen_binary(), "train", "--init", out, "--data", data, "--steps", "2",
                        "--threads", "1", "--quiet", "--out", str(tmp_path / "ft.safetensors")],
                       env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert t.returncode == 0, t.stderr


def test_refuses_a_molecule_longer_than_the_context(tmp_path):
    data, _ = data_file(tmp_path)
    r = subprocess.run([sys.executable, TOOL, "--data", data, "--out", str(tmp_path / "m.safetensors"),
                        "--ctx-len", "20", "--time-limit", "1", "--device", "cpu"], env=ENV,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert r.returncode != 0 and "does not fit --ctx-len 20" in r.stderr
    assert not (tmp_path / "m.safetensors").exists()
