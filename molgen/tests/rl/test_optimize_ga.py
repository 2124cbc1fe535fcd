"""molgen optimize with its chemistry helper (--helper on): RDKit's canonical
SMILES as the budget key for a scorer that answers one number per line,
Augmented Memory's spellings from the helper, the GA's children
(--ga-offspring) scored and trained on, rank-based replay, resume bit for
bit with the GA on, and a helper that is missing, lies, hangs or dies as a
clear error with the state saved.

Oracles: RDKit directly (canonical forms, validity), the scorer's own log
of what it was asked, and an uninterrupted run for resume. Runs are small
(budget 160-240, batch 16) on models/molgen-moses.safetensors, 2 threads.
"""
import csv
import json
import os
import subprocess
import sys

import pytest

from molgen_bin import REPO, molgen_binary

PRIOR = os.path.join(REPO, "models", "molgen-moses.safetensors")
ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")

# the plain scorer: one number per line and nothing else (docs/molgen.md's
# QED scorer, with a log of what it is asked)
PLAIN = r'''
import os, sys
from rdkit import Chem, RDLogger
from rdkit.Chem import QED
RDLogger.DisableLog("rdApp.*")
log = open(os.environ["LOG"], "a") if os.environ.get("LOG") else None
for line in sys.stdin:
    s = line.strip()
    if log: log.write(s + "\n"); log.flush()
    m = Chem.MolFromSmiles(s)
    print("nan" if m is None or m.GetNumAtoms() == 0 else "%.6f" % QED.qed(m), flush=True)
'''

# a helper that greets as molgen's and then misbehaves at its AT-th request
BAD_HELPER = r'''
import os, sys, time
sys.path.insert(0, os.environ["MOLGEN_PY"])
from molgen import chem_helper
mode, at, n = os.environ["MODE"], int(os.environ["AT"]), 0
for line in sys.stdin:
    n += 1
    if n == at:
        if mode == "lie": print("C1CC(", flush=True); continue
        if mode == "hang": time.sleep(1000)
        if mode == "exit": sys.exit(4)
        if mode == "fields": print("CCO\tCCN", flush=True); continue
    print(chem_helper.answer(line.rstrip("\n")), flush=True)
'''


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    pytest.importorskip("rdkit")
    p = tmp_path_factory.mktemp("scorer") / "qed.py"
    p.write_text(PLAIN)
    return "%s %s" % (sys.executable, p)


def optimize(out, scorer, *args, env=None, check=True, resume=False):
    cmd = [molgen_binary(), "optimize", "--prior", PRIOR, "--scorer", scorer, "--threads", "2",
           "--resume" if resume else "--out", str(out)] + [str(a) for a in args]
    r = subprocess.run(cmd, env=dict(ENV, **(env or {})), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def read_scored(d):
    with open(os.path.join(str(d), "scored.csv")) as f:
        return list(csv.DictReader(f))


def canon(s):
    from rdkit import Chem
    m = Chem.MolFromSmiles(s)
    return None if m is None else Chem.MolToSmiles(m)


def test_plain_scorer_is_asked_each_canonical_molecule_once(tmp_path, plain):
    """With the helper the scorer is sent RDKit's canonical SMILES, each
    molecule once over the run (two spellings, one call), and scored.csv's
    key is that canonical form."""
    d, log = tmp_path / "run", tmp_path / "asked.txt"
    optimize(d, plain, "--budget", 200, "--batch", 16, "--helper", "on", env={"LOG": str(log)})
    asked = log.read_text().splitlines()
    assert len(asked) == len(set(asked)), "a molecule was sent twice"
    assert all(canon(s) == s for s in asked), [s for s in asked if canon(s) != s][:3]
    rows = read_scored(d)
    assert len(rows) == 200 == len(asked)
    for r in rows:
        assert r["canonical"] == canon(r["smiles"]) and r["source"] == "agent", r


def test_augmented_memory_spellings_come_from_the_helper(tmp_path, plain):
    """The plain scorer cannot answer !randomize (it would say nan, an
    error): with the helper on, Augmented Memory runs with it."""
    d, log = tmp_path / "run", tmp_path / "asked.txt"
    optimize(d, plain, "--budget", 96, "--batch", 16, "--augmented-memory", 2, "--helper", "on",
             env={"LOG": str(log)})
    assert len(read_scored(d)) == 96
    assert not [l for l in log.read_text().splitlines() if l.startswith("!")]
    r = optimize(tmp_path / "off", plain, "--budget", 96, "--batch", 16, "--augmented-memory", 2,
                 check=False)
    assert r.returncode == 1 and "randomize" in r.stderr, r.stderr


def test_ga_children_are_scored_and_trained_on(tmp_path, plain):
    d = tmp_path / "run"
    optimize(d, plain, "--budget", 240, "--batch", 16, "--helper", "on", "--ga-offspring", 8,
             "--rank-coef", 0.01, "--memory", 20, "--replay", 4)
    rows = read_scored(d)
    ga = [r for r in rows if r["source"] == "ga"]
    assert len(rows) == 240 and 8 <= len(ga) < 240
    for r in ga:  # real molecules, canonical, with the prior's likelihood
        assert canon(r["smiles"]) == r["canonical"] == r["smiles"], r
        assert float(r["prior_nll"]) > 0 and float(r["agent_nll"]) > 0, r
    # children appear only once the memory holds two parents: not in step 0
    assert min(int(r["step"]) for r in ga) >= 1
    s = json.loads((d / "summary.json").read_text())
    assert s["options"]["ga_offspring"] == 8 and s["options"]["helper"] == "on"


def test_ga_parents_come_from_the_pool_without_a_memory(tmp_path, plain):
    """--ga-pool N: parents from the N best molecules scored so far. With no
    memory at all (--memory 0) the memory's path has no parents, so children
    show that the pool supplied them; resume with it is bit for bit."""
    run = ("--budget", 160, "--batch", 16, "--seed", 5, "--save-every", 2, "--helper", "on",
           "--ga-offspring", 6, "--ga-pool", 32, "--rank-coef", 0.01, "--memory", 0, "--replay", 0)
    d = tmp_path / "run"
    optimize(d, plain, *run)
    rows = read_scored(d)
    ga = [r for r in rows if r["source"] == "ga"]
    assert len(rows) == 160 and ga, "no children: the pool gave no parents"
    assert min(int(r["step"]) for r in ga) >= 1  # step 0 has nothing scored yet
    for r in ga:
        assert canon(r["smiles"]) == r["canonical"] == r["smiles"], r
    assert json.loads((d / "summary.json").read_text())["options"]["ga_pool"] == 32
    e = tmp_path / "resumed"
    r = optimize(e, plain, *run, "--stop-after", 3)
    assert "stop: stop-after" in r.stderr
    optimize(e, plain, resume=True)
    same_run(e, d)
    r = optimize(tmp_path / "one", plain, *run, "--ga-pool", 1, check=False)  # the last wins
    assert r.returncode != 0 and "ga-pool 1" in r.stderr, r.stderr


RUN = ("--budget", 200, "--batch", 16, "--seed", 3, "--save-every", 3, "--helper", "on",
       "--ga-offspring", 6, "--rank-coef", 0.01, "--memory", 20, "--replay", 4)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, plain):
    d = tmp_path_factory.mktemp("straight") / "run"
    optimize(d, plain, *RUN)
    return d


def same_run(a, b):
    assert (a / "scored.csv").read_text() == (b / "scored.csv").read_text()
    assert (a / "agent.safetensors").read_bytes() == (b / "agent.safetensors").read_bytes()


def test_resume_with_the_ga_is_bit_exact(tmp_path, plain, straight):
    d = tmp_path / "run"
    r = optimize(d, plain, *RUN, "--stop-after", 4)
    assert "stop: stop-after" in r.stderr
    optimize(d, plain, resume=True)
    same_run(d, straight)


@pytest.mark.parametrize("mode,at,words", [
    ("lie", 30, "is not a SMILES"),
    ("fields", 30, "more than one field"),
    ("hang", 30, "within 6 s"),
    ("exit", 30, "exited with status 4"),
])
def test_helper_fault_is_clear_and_resumable(tmp_path, plain, straight, mode, at, words):
    """A helper that lies, hangs or dies mid-run: one error naming the
    chemistry helper, the state of the step's start saved; the run resumed
    with a good helper is the uninterrupted one."""
    helper = tmp_path / "helper.py"
    helper.write_text(BAD_HELPER)
    env = {"MOLGEN_CHEM_HELPER": "%s %s" % (sys.executable, helper), "MODE": mode, "AT": str(at),
           "MOLGEN_PY": os.path.join(REPO, "python")}
    d = tmp_path / "run"
    r = optimize(d, plain, *RUN, "--scorer-timeout", 6, env=env, check=False)
    assert r.returncode == 1, r.stderr
    msg = [l for l in r.stderr.splitlines() if l.startswith("molgen optimize: ")]
    assert len(msg) == 2 and "chemistry helper" in msg[0] and words in msg[0], r.stderr
    assert "continue with --resume" in msg[1], r.stderr
    optimize(d, plain, resume=True)
    same_run(d, straight)


def test_missing_helper_says_what_it_needs(tmp_path, plain):
    r = optimize(tmp_path / "run", plain, "--budget", 50, "--helper", "on", check=False,
                 env={"MOLGEN_CHEM_HELPER": "%s -c 'import sys; sys.exit(3)'" % sys.executable})
    assert r.returncode == 1 and "did not start" in r.stderr and "python3-rdkit" in r.stderr, \
        r.stderr
    r = optimize(tmp_path / "run2", plain, "--budget", 50, "--helper", "on", check=False,
                 env={"MOLGEN_CHEM_HELPER": "echo hello"})
    assert r.returncode == 1 and "is not molgen's chemistry helper" in r.stderr, r.stderr


def test_ga_without_the_helper_is_refused(tmp_path, plain):
    r = optimize(tmp_path / "run", plain, "--ga-offspring", 4, check=False)
    assert r.returncode == 2 and "--helper on" in r.stderr, r.stderr


def test_preset_pmo_runs_with_the_ten_line_scorer(tmp_path, plain):
    """--preset pmo (the helper and the GA on) needs nothing of the scorer
    but one number per line."""
    d, log = tmp_path / "run", tmp_path / "asked.txt"
    optimize(d, plain, "--preset", "pmo", "--budget", 200, "--batch", 16, env={"LOG": str(log)})
    rows = read_scored(d)
    asked = log.read_text().splitlines()
    assert len(rows) == 200 == len(asked) == len(set(asked))
    assert any(r["source"] == "ga" for r in rows)
    s = json.loads((d / "summary.json").read_text())
    assert s["calls"] == 200 and s["stop"] == "budget"
