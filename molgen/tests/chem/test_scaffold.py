"""Scaffold conditioning (train --scaffold-column, sample --scaffold).

1. A tiny model trained briefly on synthetic molecules (a chain on one of
   three rings) builds on the scaffold it is given: RDKit's Murcko scaffold
   of the samples equals the requested one (KV and naive decoding, and with
   --constrain valence); without a scaffold it samples the data's mixture.
2. The rows as trained (--debug-dump-rows): a row with a prefix carries
   exactly its CSV line's scaffold, rows of acyclic molecules never do, and
   the prefixed share matches 1 - --scaffold-drop.
3. A scaffold run stopped half way and resumed continues bit for bit.
4. Refusals: --scaffold on a model without scaffolds, a token outside the
   vocabulary, a scaffold with no room left; --scaffold-column on a .smi
   file, an unknown column or the SMILES column; --init with scaffolds.
The prefix's lack of loss and gradient is test_model.c's (fp64 oracle and
finite differences)."""
import json
import os
import random
import struct

import pytest

pytest.importorskip("rdkit")

HERE = os.path.dirname(os.path.abspath(__file__))
from molgen_bin import run_molgen  # noqa: E402

RINGS = ["c1ccccc1", "C1CCCCC1", "c1ccncc1"]
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "models",
                       "molgen-moses.safetensors")


run = run_molgen


def murcko(smi):
    from rdkit import Chem
    from rdkit.Chem.Scaffolds import MurckoScaffold
    m = Chem.MolFromSmiles(smi)
    return None if m is None else Chem.MolToSmiles(MurckoScaffold.GetScaffoldForMol(m))


def synthetic_csv(path, n=1500, seed=1):
    """A carbon/oxygen chain on one of RINGS (or, 1 in 10, no ring); the
    scaffold column as props.py writes it (RDKit), "" for the acyclic ones."""
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        chain = "".join(r.choice("CCCO") for _ in range(r.randint(1, 5))).lstrip("O") or "C"
        smi = chain if r.random() < 0.1 else chain + r.choice(RINGS)
        rows.append((smi, murcko(smi) or ""))
    with open(path, "w") as f:
        f.write("smiles,scaffold\n")
        for smi, sc in rows:
            f.write("%s,%s\n" % (smi, sc))
    return rows


def train_args(csv, model, steps=800):
    return ["train", "--data", csv, "--scaffold-column", "scaffold", "--layers", "2",
            "--d-model", "32", "--heads", "2", "--steps", str(steps), "--batch-size", "32",
            "--out", model, "--threads", "1", "--quiet"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("scaffold")
    csv = str(d / "syn.csv")
    rows = synthetic_csv(csv)
    model = str(d / "m.safetensors")
    run(train_args(csv, model))
    return d, csv, rows, model


def test_config_records_the_longest_scaffold(trained):
    _, _, rows, model = trained
    b = open(model, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    cfg = json.loads(json.loads(b[8:8 + n])["__metadata__"]["config"])
    longest = max(len(s) for _, s in rows)  # one character per token for these rings
    longest_mol = max(len(m) for m, _ in rows)
    assert cfg["scaffold"] == longest
    assert cfg["ctx_len"] == longest_mol + 1 + longest + 1


@pytest.mark.parametrize("decode,constrain", [("kv", "none"), ("naive", "none"),
                                              ("kv", "valence")])
def test_builds_on_the_scaffold_given(trained, decode, constrain):
    d, _, _, model = trained
    for ring in RINGS:
        out = str(d / ("s_%s_%s_%s.smi" % (RINGS.index(ring), decode, constrain)))
        run(["sample", "--model", model, "-n", "200", "--out", out, "--threads", "1",
             "--decode", decode, "--constrain", constrain, "--scaffold", ring, "--seed", "3"])
        mols = open(out).read().splitlines()
        assert len(mols) == 200
        share = sum(murcko(m) == ring for m in mols) / len(mols)
        print("scaffold %s, %s decoding, constrain %s: exact share %.3f" % (ring, decode, constrain, share))
        assert share >= 0.9, (ring, share, mols[:10])
        assert json.load(open(out + ".json"))["scaffold"] == ring
    # without a scaffold: the data's mixture of the three rings (and acyclic)
    out = str(d / ("s_none_%s.smi" % decode))
    run(["sample", "--model", model, "-n", "300", "--out", out, "--threads", "1",
         "--decode", decode, "--seed", "4"])
    mols = open(out).read().splitlines()
    for ring in RINGS:
        share = sum(murcko(m) == ring for m in mols) / len(mols)
        assert 0.15 <= share <= 0.5, (ring, share)


def test_rows_as_trained(tmp_path):
    csv = str(tmp_path / "syn.csv")
    rows = synthetic_csv(csv, n=400, seed=2)
    dump = str(tmp_path / "rows.tsv")
    run(train_args(csv, str(tmp_path / "m.safetensors"), steps=40)
        + ["--scaffold-drop", "0.4", "--debug-dump-rows", dump, "--val-frac", "0"])
    lines = [ln.split("\t") for ln in open(dump).read().splitlines()]
    assert len(lines) == 40 * 32
    prefixed = with_scaffold = 0
    for step, line, smi, pre in lines:
        mol, sc = rows[int(line) - 2]  # line 1 is the header
        assert smi == mol
        if sc:
            with_scaffold += 1
        if pre:
            assert pre == sc, (line, pre, sc)
            prefixed += 1
    # each row with a scaffold keeps it with p = 0.6: 5 binomial SDs
    p, n = 0.6, with_scaffold
    assert abs(prefixed - p * n) <= 5 * (n * p * (1 - p)) ** 0.5, (prefixed, n)


def test_resume_bit_for_bit(tmp_path):
    csv = str(tmp_path / "syn.csv")
    synthetic_csv(csv, n=300, seed=3)
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    run(train_args(csv, a, steps=20) + ["--seed", "5"])
    run(train_args(csv, b, steps=20) + ["--seed", "5", "--stop-after", "10"])
    run(["train", "--resume", b, "--threads", "1", "--quiet"])
    assert open(a, "rb").read() == open(b, "rb").read()


def test_refusals(trained, tmp_path):
    d, csv, _, model = trained
    out = str(tmp_path / "s.smi")
    for scaffold, msg in [("c1ccccc1[Se]", "unknown token '[Se]'"),
                          ("[Se]1cccc1", "unknown token '[Se]'"),
                          ("c1ccccc1" * 12, "leave no room")]:
        p = run(["sample", "--model", model, "--scaffold", scaffold, "-n", "2", "--out", out],
                ok=False)
        assert p.returncode == 2 and msg in p.stderr, (scaffold, p.stderr)
    p = run(["sample", "--model", SHIPPED, "--scaffold", "c1ccccc1", "-n", "2", "--out", out],
            ok=False)
    assert p.returncode == 2 and "not trained with scaffolds" in p.stderr
    smi = tmp_path / "x.smi"
    smi.write_text("CCc1ccccc1\nCCO\n" * 20)
    for args, msg in [(["--data", str(smi), "--scaffold-column", "scaffold"],
                       "needs a .csv data file"),
                      (["--data", csv, "--scaffold-column", "ring"], "ring"),
                      (["--data", csv, "--scaffold-column", "smiles"], "is the SMILES column"),
                      (["--data", csv, "--scaffold-column", "scaffold", "--init", SHIPPED],
                       "not supported")]:
        p = run(["train"] + args + ["--steps", "1", "--batch-size", "4", "--out",
                                    str(tmp_path / "t.safetensors"), "--quiet"], ok=False)
        assert p.returncode != 0 and msg in p.stderr, (args, p.stderr)
