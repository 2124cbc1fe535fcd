"""The end-of-run report of `train --init` compares the fine-tuned model's
validity with the base model's on the same draws and says what to change
when fine-tuning drifts, through the binary:

- the report has "check: validity F% fine-tuned vs B% for BASE on the same
  N draws" and the JSON's check has base_syntax_ok;
- a run that memorises its 8 molecules (lr 0.03, --keep last) is warned
  about with what to change; a 2-step run is within the targets.
Oracles: `molgen sample --seed 1` of each model (the check's draws: the
output does not depend on batch or threads) read here: the copies counted
by string match against the training lines, RDKit validity as a lower
bound and the non-empty lines as an upper bound of the syntax check."""
import json
import os
import subprocess

import pytest

from molgen_bin import ENV, TINY, molgen_binary, write_molecules  # noqa: E402

rdkit = pytest.importorskip("rdkit")
from rdkit import Chem, RDLogger  # noqa: E402

RDLogger.DisableLog("rdApp.*")
N = 100


def run(args):
    p = subprocess.run([molgen_binary()] + args, capture_output=True, text=True, timeout=300,
                       env=ENV)
    assert p.returncode == 0, p.stderr
    return p


def samples(model, d, name):
    out = os.path.join(str(d), name)
    run(["sample", "--model", model, "-n", str(N), "--seed", "1", "--out", out,
         "--threads", "1"])
    with open(out) as f:
        return f.read().split("\n")[:N]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("base")
    data, _ = write_molecules(d, 300)
    out = str(d / "base.safetensors")
    run(["train", "--data", data, "--steps", "40", "--out", out, "--quiet"] + TINY)
    return out


def finetune(base, d, extra):
    data, mols = write_molecules(d, 8, name="ft.smi")
    out = str(d / "ft.safetensors")
    p = run(["train", "--init", base, "--data", data, "--check-samples", str(N), "--out", out,
             "--threads", "1", "--no-progress"] + extra)
    return p, json.loads(p.stdout.splitlines()[-1])["check"], out, mols


def check_against_oracle(base, d, p, chk, out, mols):
    got = samples(out, d, "ft_samples.smi")
    ref = samples(base, d, "base_samples.smi")
    train = set(mols)
    rd = [s for s in got if s and Chem.MolFromSmiles(s) is not None]
    assert len(rd) <= chk["syntax_ok"] <= sum(1 for s in got if s)
    # copies: samples equal to a training line as written (each one valid)
    assert chk["copies"] == sum(1 for s in got if s in train)
    rdb = [s for s in ref if s and Chem.MolFromSmiles(s) is not None]
    assert len(rdb) <= chk["base_syntax_ok"] <= sum(1 for s in ref if s)
    line = ("check: validity %.1f%% fine-tuned vs %.1f%% for %s on the same %d draws"
            % (100.0 * chk["syntax_ok"] / N, 100.0 * chk["base_syntax_ok"] / N, base, N))
    assert line in p.stderr, p.stderr
    return rd, train


def test_memorising_run_warned(base, tmp_path):
    p, chk, out, mols = finetune(base, tmp_path, ["--steps", "60", "--lr", "0.03", "--keep",
                                                  "last"])
    rd, train = check_against_oracle(base, tmp_path, p, chk, out, mols)
    copies = sum(1 for s in rd if s in train)
    assert copies >= 0.05 * len(rd) > 0  # the oracle: it does copy its set
    assert "check: warning: " in p.stderr and "What to change: " in p.stderr
    assert "5% or more of the valid samples copy the fine-tuning set" in p.stderr


def test_short_run_within_targets(base, tmp_path):
    p, chk, out, mols = finetune(base, tmp_path, ["--steps", "2"])
    rd, train = check_against_oracle(base, tmp_path, p, chk, out, mols)
    assert not any(s in train for s in rd)
    assert chk["base_syntax_ok"] - chk["syntax_ok"] < 0.03 * N
    assert "within the targets" in p.stderr and "check: warning" not in p.stderr
