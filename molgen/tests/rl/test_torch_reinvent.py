"""molgen.torch_reinvent (the PyTorch baseline of molgen optimize): its
scorer client refuses what the protocol forbids, and a short run against a
scorer written here spends the budget on distinct molecules only, as
scored.csv and summary.json say."""
import csv
import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
from molgen import pmo  # noqa: E402
from molgen.torch_reinvent import Scorer, ScorerError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PRIOR = os.path.join(REPO, "models", "molgen-moses.safetensors")

# score = share of 'c' among the characters (aromatic atoms), canonical = the
# SMILES with its ring digits dropped (several spellings -> one key), nan for
# a SMILES with an 'X' (never sampled: a stand-in for unparsable)
FAKE = r"""
import sys
for line in sys.stdin:
    s = line.strip()
    if 'X' in s:
        print('nan', flush=True)
        continue
    key = ''.join(ch for ch in s if not ch.isdigit())
    print('%.6f\tcanonical=%s\tarom=%d' % (s.count('c') / max(len(s), 1), key, s.count('c')),
          flush=True)
"""


def scorer_cmd(tmp_path, body):
    p = tmp_path / "scorer.py"
    p.write_text(body)
    return "%s %s" % (sys.executable, p)


def test_client_reads_fields_and_nan(tmp_path):
    s = Scorer(scorer_cmd(tmp_path, FAKE))
    r = s.score(["c1ccccc1", "CXC", "CC"])
    s.close()
    assert r[0]["valid"] and r[0]["score"] == 0.75 and r[0]["canonical"] == "cccccc"
    assert r[0]["comps"] == ["arom=6"]
    assert not r[1]["valid"] and r[1]["score"] == 0.0
    assert r[2]["score"] == 0.0 and r[2]["valid"]


@pytest.mark.parametrize("body,msg", [
    ("import sys\nfor l in sys.stdin: print('abc', flush=True)\n", "not a number"),
    ("import sys\nfor l in sys.stdin: print('1.5', flush=True)\n", "outside [0, 1]"),
    ("import sys\nfor l in sys.stdin: print('-inf', flush=True)\n", "outside [0, 1]"),
    ("import sys\nsys.stdin.readline()\n", "exited"),
    ("import sys, time\nsys.stdin.readline(); time.sleep(30)\n", "no answer"),
])
def test_client_refuses(tmp_path, body, msg):
    s = Scorer(scorer_cmd(tmp_path, body), timeout=5.0)  # the interpreter's start included
    with pytest.raises(ScorerError, match=msg.replace("[", r"\[").replace("]", r"\]")):
        s.score(["CCO"])
    s.close()


def test_short_run_spends_budget_on_distinct_molecules(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "molgen.torch_reinvent", "--prior", PRIOR,
                        "--scorer", scorer_cmd(tmp_path, FAKE), "--budget", "150",
                        "--batch", "32", "--seed", "3", "--out", str(out)],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    assert p.returncode == 0, p.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "scored.csv")))
    assert [int(r["call"]) for r in rows] == list(range(1, 151))
    keys = [r["canonical"] for r in rows]
    assert len(set(keys)) == 150
    # each row's score and key are the fake scorer's on its own SMILES
    for r in rows:
        s = r["smiles"]
        assert r["canonical"] == "".join(ch for ch in s if not ch.isdigit())
        assert float(r["score"]) == pytest.approx(s.count("c") / len(s), abs=1e-6)
        assert float(r["prior_nll"]) > 0
    summ = json.load(open(out / "summary.json"))
    assert summ["calls"] == 150 and summ["stop"] == "budget"
    scores = [float(r["score"]) for r in rows]
    assert summ["auc_top10"] == pytest.approx(pmo.auc(scores, 10, 150))
    assert os.path.getsize(out / "agent.safetensors") > 1000


def test_ga_offspring_are_scored_calls_of_the_budget(tmp_path):
    # Genetic GFN's exploration step: children of the best molecules (RDKit
    # canonical SMILES from molgen.graph_ga) spend calls like the agent's
    # samples, each with its prior NLL, and the budget still holds
    pytest.importorskip("rdkit")
    from rdkit import Chem
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "molgen.torch_reinvent", "--prior", PRIOR,
                        "--scorer", scorer_cmd(tmp_path, FAKE), "--budget", "160",
                        "--batch", "32", "--seed", "3", "--ga-offspring", "16",
                        "--ga-mutation", "0.5", "--out", str(out)],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    assert p.returncode == 0, p.stderr[-2000:]
    rows = list(csv.DictReader(open(out / "scored.csv")))
    summ = json.load(open(out / "summary.json"))
    assert summ["calls"] == len(rows) == 160
    assert len({r["canonical"] for r in rows}) == 160
    assert 0 < summ["ga_calls"] < 160
    # children are RDKit's canonical strings; the agent's samples mostly are not
    canon = [r for r in rows if Chem.MolFromSmiles(r["smiles"]) is not None
             and Chem.MolToSmiles(Chem.MolFromSmiles(r["smiles"])) == r["smiles"]]
    assert len(canon) >= summ["ga_calls"]
    for r in rows:
        assert float(r["prior_nll"]) > 0


CONST = r"""
import sys
for line in sys.stdin:
    s = line.strip()
    print('0.25\tcanonical=%s' % s, flush=True)
"""


def test_replay_loops_and_patience(tmp_path, monkeypatch, capsys):
    # --replay-loops 2 adds two Adam steps a step (on rank-drawn memory rows);
    # --patience 2 with every molecule at 0.25 (a top 100 that never moves)
    # stops where bench/pmo_patience.py, which replays molgen optimize's
    # stop to the call, says the rule stops this run's scored.csv (the
    # rule's 1,000 calls and 100 hits scaled down to 50 and 10 for time)
    import importlib.util
    from molgen import torch_reinvent
    spec = importlib.util.spec_from_file_location(
        "bench_pmo_patience", os.path.join(REPO, "bench", "pmo_patience.py"))
    pat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pat)
    monkeypatch.setattr(torch_reinvent, "PLATEAU_CALLS", 50)
    monkeypatch.setattr(torch_reinvent, "PLATEAU_HITS", 10)
    out = tmp_path / "run"
    rc = torch_reinvent.main(["--prior", PRIOR, "--scorer", scorer_cmd(tmp_path, CONST),
                              "--budget", "160", "--batch", "16", "--seed", "3", "--memory",
                              "100", "--replay", "24", "--rank-coef", "0.01", "--replay-loops",
                              "2", "--patience", "2", "--out", str(out)])
    assert rc == 0
    # every step's loss is a number (a memory row without its prior NLL,
    # replayed in the loop and in the next step, would make it NaN)
    losses = [float(x.split("loss ")[1].split(",")[0])
              for x in capsys.readouterr().err.splitlines() if "loss " in x]
    assert losses and all(math.isfinite(v) and v > 0 for v in losses)
    summ = json.load(open(out / "summary.json"))
    assert summ["stop"] == "patience" and 50 < summ["calls"] < 160, summ
    assert summ["updates"] == 3 * summ["steps"]
    assert summ["options"]["replay_loops"] == 2 and summ["options"]["patience"] == 2
    steps = pat.read_steps(str(out / "scored.csv"), summ["steps"])
    stop = pat.replay(steps, 2, min_calls=50, min_hits=10)
    assert stop == summ["steps"] - 1 and pat.auc_until(steps, stop, 160)[1] == summ["calls"]
    bad = subprocess.run([sys.executable, "-m", "molgen.torch_reinvent", "--prior", PRIOR,
                          "--scorer", "true", "--replay", "0", "--replay-loops", "1",
                          "--out", str(tmp_path / "bad")], capture_output=True, text=True)
    assert bad.returncode == 2 and "replay loops need replay > 0" in bad.stderr
