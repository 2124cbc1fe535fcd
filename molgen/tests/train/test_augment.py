"""molgen train --augment randomized, through the binary, with
RDKit as the oracle:

- molgen.randomize_smiles writes, per data line, copies that are the same
  molecule (RDKit canonical SMILES equal) and mostly differ from the input;
- every row the trainer trains on (--debug-dump-rows) is a valid SMILES of
  its data line's molecule, and not always the one written in the file;
- the same seed draws the same rows, another seed others; a run stopped and
  resumed writes the same rows and the same checkpoint bytes;
- the vocabulary covers tokens only the copies have ('(' for CCO);
- a copies file for another data file, or none, is a clear error.
Run with /usr/bin/python3 -m pytest (needs RDKit)."""
import os
import subprocess
import sys

import pytest

from molgen_bin import molgen_binary, write_molecules  # noqa: E402

Chem = pytest.importorskip("rdkit.Chem")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TOOL = ["-m", "molgen.randomize_smiles"]
TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--batch-size", "8",
        "--no-progress", "--val-every", "0", "--threads", "1", "--quiet"]


def run(args, timeout=300):
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell", OMP_WAIT_POLICY="PASSIVE")
    return subprocess.run([molgen_binary()] + args, capture_output=True, text=True,
                          timeout=timeout, env=env)


def canon(s):
    m = Chem.MolFromSmiles(s)
    return None if m is None else Chem.MolToSmiles(m)


def randomize(data, out, k=4, seed=1):
    p = subprocess.run([sys.executable] + TOOL + [str(data), str(out), "--k", str(k), "--seed",
                        str(seed), "--jobs", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return out.read_text().splitlines()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("aug")
    _, mols = write_molecules(d, 300)
    smi = d / "mols.smi"
    aug = d / "mols.aug"
    lines = randomize(smi, aug)
    return smi, aug, mols, lines


def test_tool_writes_the_same_molecules(data):
    smi, aug, mols, lines = data
    assert lines[0].startswith("#molgen-augment v1 k=4 seed=1 lines=300")
    assert len(lines) == 301
    differ = 0
    for mol, line in zip(mols, lines[1:]):
        copies = line.split()
        assert len(copies) == 4
        for c in copies:
            assert canon(c) == canon(mol), (mol, c)
            differ += c != mol
    assert differ > 300 * 4 // 2  # random atom orders, not the input again


def train(data, out, extra, dump=None):
    smi, aug, _, _ = data
    args = ["train", "--data", str(smi), "--augment", "randomized", "--augment-file", str(aug),
            "--out", str(out)] + TINY + extra
    if dump:
        args += ["--debug-dump-rows", str(dump)]
    p = run(args)
    assert p.returncode == 0, p.stderr
    return p


def rows(dump):
    out = []
    for l in dump.read_text().splitlines():
        step, line, smi = l.split("\t")
        out.append((int(step), int(line), smi))
    return out


def test_trained_rows_are_the_molecules_randomized(data, tmp_path):
    _, _, mols, _ = data
    dump = tmp_path / "rows.tsv"
    train(data, tmp_path / "m.safetensors", ["--steps", "30"], dump)
    r = rows(dump)
    assert len(r) == 30 * 8 and r[0][0] == 0 and r[-1][0] == 29
    as_written = 0
    for _, line, smi in r:
        assert canon(smi) is not None, smi
        assert canon(smi) == canon(mols[line - 1]), (line, smi)
        as_written += smi == mols[line - 1]
    assert as_written < len(r) // 2


def test_seed_determinism_and_bit_exact_resume(data, tmp_path):
    d1, d2, d3 = tmp_path / "1.tsv", tmp_path / "2.tsv", tmp_path / "3.tsv"
    train(data, tmp_path / "a.safetensors", ["--steps", "24"], d1)
    train(data, tmp_path / "b.safetensors", ["--steps", "24", "--stop-after", "11"], d2)
    p = run(["train", "--resume", str(tmp_path / "b.safetensors"), "--threads", "1", "--quiet",
             "--no-progress", "--debug-dump-rows", str(d2)])
    assert p.returncode == 0, p.stderr
    assert d1.read_bytes() == d2.read_bytes()
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    train(data, tmp_path / "c.safetensors", ["--steps", "24", "--seed", "2"], d3)
    assert d3.read_bytes() != d1.read_bytes()


def test_vocabulary_covers_the_copies(tmp_path):
    smi = tmp_path / "small.smi"
    smi.write_text("CCO\nCCN\nCCCO\nCCCN\nOCCN\nCCCC\nCCCCO\nNCCCO\n")
    aug = tmp_path / "small.aug"
    lines = randomize(smi, aug, k=6, seed=5)
    assert any("(" in l for l in lines[1:])  # e.g. C(C)O
    out = tmp_path / "s.safetensors"
    p = run(["train", "--data", str(smi), "--augment", "randomized", "--augment-file", str(aug),
             "--out", str(out), "--steps", "5", "--val-frac", "0.0"] + TINY)
    assert p.returncode == 0, p.stderr
    import json
    import struct
    with open(out, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        vocab = json.loads(json.loads(f.read(n))["__metadata__"]["vocab"])
    assert "(" in vocab and ")" in vocab


def test_wrong_or_missing_copies_file(data, tmp_path):
    smi, aug, _, _ = data
    other = tmp_path / "other.smi"
    other.write_text("\n".join(smi.read_text().splitlines()[:100]) + "\n")
    p = run(["train", "--data", str(other), "--augment", "randomized", "--augment-file", str(aug),
             "--out", str(tmp_path / "x.safetensors"), "--steps", "2"] + TINY)
    assert p.returncode == 1 and "covers 300 lines" in p.stderr, p.stderr
    p = run(["train", "--data", str(smi), "--augment", "randomized",
             "--out", str(tmp_path / "x.safetensors"), "--steps", "2"] + TINY)
    assert p.returncode != 0 and "--augment-file" in p.stderr, p.stderr
    p = run(["train", "--data", str(smi), "--augment", "rotated", "--augment-file", str(aug),
             "--out", str(tmp_path / "x.safetensors"), "--steps", "2"] + TINY)
    assert p.returncode != 0 and "none or randomized" in p.stderr, p.stderr
    assert not (tmp_path / "x.safetensors").exists()
