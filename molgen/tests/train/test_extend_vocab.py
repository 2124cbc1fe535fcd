"""molgen train --init MODEL --extend-vocab, from the command line, on the
shipped prior models/molgen-moses.safetensors (no 'B' in its vocabulary)
and boronic acids made from data/moses_20k.smi by tools/new_element_set.py
(RDKit).

Oracles: the base model's own `molgen score` NLLs and samples, the PyTorch
twin (molgen.torch_model, float64) for the new token's probability, and
the files' JSON read by Python.
- Without the flag the data is refused before any training, every unknown
  token named with its count and first file:line, --extend-vocab named.
- With it and no training (one step at lr 1e-30: Adam moves a parameter
  by about lr, so nothing moves at fp32 resolution), the extended model
  gives every molecule of old tokens the base model's NLL up to rounding
  (relative 1e-6: the new token's share of the partition is <= e^-18,
  below fp32's 2^-24, so only the products' last bits differ) and the same
  samples; its vocabulary is the base's with 'B' appended; the new token's
  probability is <= e^-18 at every position of the data (the bound holds
  at any input).
- The extended file is read by score (a boronic acid is ok), sample, and a
  second --init (no flag needed: its vocabulary has 'B').
- --resume of an extended run is bitwise the straight run (the new rows'
  optimizer spans come back from the checkpoint)."""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(REPO, "python"))

from molgen_bin import molgen_binary  # noqa: E402

BASE = os.path.join(REPO, "models", "molgen-moses.safetensors")
DATA = os.path.join(REPO, "data", "moses_20k.smi")
ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")


def run(*args):
    return subprocess.run([molgen_binary(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=ENV, check=False)


def scores(model, smi):
    p = run("score", "--model", model, "--smiles", smi, "--quiet", "--threads", "1")
    assert p.returncode == 0, p.stderr
    rows = p.stdout.decode().splitlines()
    head = rows[0].split(",")
    return [dict(zip(head, r.split(","))) for r in rows[1:]]


def vocab(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(json.loads(f.read(n))["__metadata__"]["vocab"])


@pytest.fixture(scope="module")
def boron(tmp_path_factory):
    pytest.importorskip("rdkit")
    d = tmp_path_factory.mktemp("xv")
    p = subprocess.run([sys.executable, os.path.join(REPO, "tools", "new_element_set.py"), DATA,
                        str(d / "boron.smi"), "--element", "B", "-n", "120"],
                       stderr=subprocess.PIPE, check=False)
    assert p.returncode == 0, p.stderr
    with open(DATA) as f:
        (d / "old.smi").write_text("".join(next(f).split()[0] + "\n" for _ in range(60)))
    return d


def test_unknown_tokens_are_refused_with_a_list(boron):
    d = boron
    data = d / "mixed.smi"
    lines = (d / "boron.smi").read_text().splitlines()[:100]
    data.write_text("\n".join(lines + ["CC[Se]CC", "C[Se]C[Si](C)(C)C"]) + "\n")
    out = d / "never.safetensors"
    p = run("train", "--init", BASE, "--data", str(data), "--steps", "5", "--out", str(out),
            "--threads", "1", "--no-progress")
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "3 token(s) that --init" in err and "--extend-vocab" in err
    assert f"'B' (100 molecules, first at {data}:1)" in err
    assert f"'[Se]' (2 molecules, first at {data}:101)" in err
    assert f"'[Si]' (1 molecule, first at {data}:102)" in err
    assert "step" not in err.split("lacks")[0] and not out.exists()  # before any training
    p = run("train", "--data", str(data), "--steps", "1", "--extend-vocab", "--out", str(out))
    assert p.returncode == 1 and b"--extend-vocab needs --init" in p.stderr


@pytest.fixture(scope="module")
def extended(boron):
    d = boron
    out = str(d / "step0.safetensors")
    p = run("train", "--init", BASE, "--data", str(d / "boron.smi"), "--extend-vocab",
            "--steps", "1", "--lr", "1e-30", "--keep", "last", "--check-samples", "0",
            "--threads", "1", "--no-progress", "--out", out)
    assert p.returncode == 0, p.stderr
    assert b"--extend-vocab: 1 new token(s) 'B' (120 molecules" in p.stderr
    return out


def test_step0_probabilities_of_old_tokens_unchanged(boron, extended):
    assert vocab(extended) == vocab(BASE) + ["B"]
    old = str(boron / "old.smi")
    a, b = scores(BASE, old), scores(extended, old)
    assert len(a) == 60 and all(r["status"] == "ok" for r in a + b)
    for x, y in zip(a, b):
        assert abs(float(x["nll"]) - float(y["nll"])) <= 1e-6 * float(x["nll"]), (x, y)
    s0 = []
    for k, m in enumerate((BASE, extended)):
        out = boron / f"same{k}.smi"
        p = run("sample", "--model", m, "-n", "40", "--seed", "3", "--threads", "1", "--out",
                str(out))
        assert p.returncode == 0, p.stderr
        s0.append(out.read_text().splitlines())
    assert len(s0[0]) == 40 and s0[0] == s0[1]


def test_new_token_probability_bound(boron, extended):
    torch = pytest.importorskip("torch")
    tm = pytest.importorskip("molgen.torch_model")
    model, voc = tm.load_model(extended, dtype=torch.float64)
    smiles = tm.read_smiles(str(boron / "boron.smi")) + tm.read_smiles(str(boron / "old.smi"))
    ids, lengths = tm.encode(smiles, voc, model.cfg.ctx_len + 1)
    ids, lengths = torch.from_numpy(ids), torch.from_numpy(lengths)
    model.eval()
    with torch.no_grad():
        logp = torch.log_softmax(model.logits(ids[:, :-1], lengths - 1), -1)
    valid = torch.arange(ids.shape[1] - 1)[None, :] < (lengths - 1)[:, None]
    worst = float(logp[..., voc.index("B")][valid].max())
    assert worst <= -18.0, worst
    # random inputs too: the bound is for any input
    g = torch.Generator().manual_seed(1)
    rnd = torch.randint(3, len(voc), (64, model.cfg.ctx_len), generator=g)
    rnd[:, 0] = 1
    with torch.no_grad():
        lp = torch.log_softmax(model.logits(rnd, None), -1)[..., voc.index("B")]
    assert float(lp.max()) <= -18.0


def test_new_rows_start_where_the_base_model_predicts_the_new_token(boron, extended):
    """The new rows are q-weighted means of the base model's: q = the base
    model's next-token distribution (PyTorch twin, float64) summed over the
    data rows' first 'B', normalised; head row = q @ W, bias = q.b + H(q) -
    18 (less a rounding allowance); the embedding row is the mean of the
    data-token rows. And they help: at the data's 'B' positions the new token
    starts far above the data-independent bound's start."""
    torch = pytest.importorskip("torch")
    tm = pytest.importorskip("molgen.torch_model")
    base, bvoc = tm.load_model(BASE, dtype=torch.float64)
    ext, xvoc = tm.load_model(extended, dtype=torch.float64)
    V0, nb = len(bvoc), xvoc.index("B")
    smiles = tm.read_smiles(str(boron / "boron.smi"))
    ids, lengths = tm.encode(smiles, xvoc, base.cfg.ctx_len + 1)
    first = [int(np.argmax(r == nb)) for r in ids]  # BOS at 0, so > 0 where B is
    assert all(f > 0 for f in first)
    inp = torch.from_numpy(np.where(ids[:, :-1] < V0, ids[:, :-1], 0))
    base.eval()
    ext.eval()
    with torch.no_grad():
        p = torch.softmax(base.logits(inp, torch.tensor(first)), -1)
    q = sum(p[i, f - 1] for i, f in enumerate(first))
    q = q / q.sum()
    W, b, E = base.head.weight.detach(), base.head.bias.detach(), base.tok_emb.weight.detach()
    w_new = ext.head.weight.detach()[nb]
    assert torch.allclose(w_new, q @ W, rtol=0, atol=1e-6), float((w_new - q @ W).abs().max())
    H = float(-torch.special.xlogy(q, q).sum())
    want = float(q @ b) + H - 18.0
    got = float(ext.head.bias.detach()[nb])
    assert want - 1e-4 <= got <= want, (got, want)
    e_new = ext.tok_emb.weight.detach()[nb]
    assert torch.allclose(e_new, E[3:].mean(0), rtol=0, atol=1e-6)
    # where 'B' first occurs, log p = -18 - KL(q || p) (Gibbs' gap), well above
    # the data-independent start (below -30 there on this data)
    with torch.no_grad():
        lp = torch.log_softmax(ext.logits(torch.from_numpy(ids[:, :-1]), None), -1)[..., nb]
    at = torch.stack([lp[i, f - 1] for i, f in enumerate(first)])
    kl = torch.stack([(torch.special.xlogy(q, q) - q * p[i, f - 1].log()).sum()
                      for i, f in enumerate(first)])
    assert torch.allclose(at, -18.0 - kl - (want - got), rtol=0, atol=2e-3), \
        float((at + 18 + kl).abs().max())
    assert float(at.mean()) > -25.0, float(at.mean())


def test_check_samples_after_extension(boron):
    """The end-of-run check samples the kept model and the base model; the
    base model reads its own vocabulary (the grown one has one more token:
    the run failed here after saving its file)."""
    out = boron / "checked.safetensors"
    p = run("train", "--init", BASE, "--data", str(boron / "boron.smi"), "--extend-vocab",
            "--steps", "2", "--check-samples", "20", "--threads", "1", "--no-progress",
            "--out", str(out))
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert "check: 20 molecules sampled" in err, err
    summary = json.loads(p.stdout.decode().strip().splitlines()[-1])
    assert summary["check"]["samples"] == 20 and 0 <= summary["check"]["base_syntax_ok"] <= 20


def test_extended_model_is_read_by_sample_score_and_a_second_init(boron, extended):
    d = boron
    rows = scores(extended, str(d / "boron.smi"))
    assert len(rows) == 120 and all(r["status"] == "ok" for r in rows)
    p = run("sample", "--model", extended, "-n", "20", "--seed", "1", "--threads", "1",
            "--out", str(d / "s20.smi"))
    assert p.returncode == 0, p.stderr
    assert len((d / "s20.smi").read_text().splitlines()) == 20
    out2 = str(d / "second.safetensors")
    p = run("train", "--init", extended, "--data", str(d / "boron.smi"), "--steps", "2",
            "--check-samples", "0", "--threads", "1", "--no-progress", "--out", out2)
    assert p.returncode == 0, p.stderr
    assert b"--extend-vocab" not in p.stderr and vocab(out2) == vocab(extended)


def test_resume_of_an_extended_run_is_the_straight_run(boron):
    """The new rows' own optimizer spans (100x lr) come back on --resume from
    the checkpoint's "new_rows": a stopped and resumed run ends bitwise
    where the straight run does."""
    tm = pytest.importorskip("molgen.torch_model")
    d = boron
    common = ["train", "--init", BASE, "--data", str(d / "boron.smi"), "--extend-vocab",
              "--steps", "6", "--keep", "last", "--check-samples", "0", "--threads", "1",
              "--no-progress"]
    straight, half = str(d / "straight.safetensors"), str(d / "half.safetensors")
    assert run(*common, "--out", straight).returncode == 0
    assert run(*common, "--stop-after", "3", "--out", half).returncode == 0
    p = run("train", "--resume", half, "--threads", "1", "--no-progress", "--check-samples", "0",
            "--out", half)
    assert p.returncode == 0, p.stderr
    a, _ = tm.load_safetensors(straight)
    b, meta = tm.load_safetensors(half)
    assert json.loads(meta["train"])["new_rows"] == len(vocab(BASE))
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k


BORON_SCORER = r'''
import sys
from rdkit import Chem, RDLogger
RDLogger.DisableLog("rdApp.*")
for line in sys.stdin:
    m = Chem.MolFromSmiles(line.strip())
    if m is None or m.GetNumAtoms() == 0:
        print("nan", flush=True)
        continue
    print("%.3f" % (sum(a.GetSymbol() == "B" for a in m.GetAtoms()) > 0), flush=True)
'''


def test_extended_model_is_read_by_attention_and_optimize(boron, extended):
    """attention draws a molecule with the new token; optimize takes the
    extended model as its prior, and its agent keeps the extended vocabulary."""
    d = boron
    mol = (d / "boron.smi").read_text().split()[0]
    assert "B" in mol.replace("Br", "")
    p = run("attention", "--model", extended, "--smiles", mol, "--threads", "1",
            "--out", str(d / "att"))
    assert p.returncode == 0, p.stderr
    svg = (d / "att" / "attention.svg").read_text()
    assert svg.startswith("<svg") or "<svg" in svg[:200]
    assert (d / "att" / "attention_heads.tsv").read_text().count("\n") > 1
    sc = d / "boron_scorer.py"
    sc.write_text(BORON_SCORER)
    out = d / "opt"
    p = run("optimize", "--prior", extended, "--scorer", "%s %s" % (sys.executable, sc),
            "--budget", "48", "--batch", "16", "--seed", "1", "--threads", "1", "--out", str(out))
    assert p.returncode == 0, p.stderr
    with open(out / "scored.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 40
    # the extension is fresh (step 0 of fine-tuning: the new token at
    # probability <= e^-18), so the molecules are old-vocabulary ones, with
    # the prior's NLL under the extended model
    assert all(0 < float(r["prior_nll"]) < 1e3 for r in rows)
    assert vocab(str(out / "agent.safetensors")) == vocab(extended)
