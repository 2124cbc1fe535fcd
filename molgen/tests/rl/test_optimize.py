"""molgen optimize: the DAP gradient against float64 PyTorch, learning, the
budget and the cache, scorer faults (each a clear error and a resumable
state), and bit-exact resume.

The scorer is a small script written here: score = the share of nitrogen
atoms (RDKit), canonical= RDKit's canonical SMILES; a fault mode makes it
misbehave at its AT-th molecule. Runs are small (budget 200-480, batch 16-32)
on models/molgen-moses.safetensors with 2 threads.
"""
import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from molgen_bin import REPO, molgen_binary

PRIOR = os.path.join(REPO, "models", "molgen-moses.safetensors")
ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")

SCORER = r'''
import os, sys, time
from rdkit import Chem, RDLogger
RDLogger.DisableLog("rdApp.*")
mode, at = os.environ.get("FAULT", ""), int(os.environ.get("AT", "0"))
log = os.environ.get("LOG")
logf = open(log, "a") if log else None
const = os.environ.get("CONST_CANONICAL")
flat = os.environ.get("CONST_SCORE")
n = 0
for line in sys.stdin:
    s = line.rstrip("\n")
    if s.startswith("!randomize"):
        _, seed, k, smi = s.split("\t")
        if logf: logf.write("!randomize\t" + smi + "\n"); logf.flush()
        m = Chem.MolFromSmiles(smi)
        if os.environ.get("BAD_RANDOMIZE"):  # the same wrong answer for each
            print("\t".join([os.environ["BAD_RANDOMIZE"]] * int(k)), flush=True); continue
        out = [] if m is None else [Chem.MolToSmiles(m, doRandom=True, canonical=False) for _ in range(int(k))]
        print("\t".join(out), flush=True)
        continue
    n += 1
    if logf: logf.write(s + "\n"); logf.flush()
    if n == at:
        if mode == "garbage": print("oops not a number", flush=True); continue
        if mode == "inf": print("inf", flush=True); continue
        if mode == "big": print("1.5", flush=True); continue
        if mode == "neg": print("-0.1", flush=True); continue
        if mode == "hang": time.sleep(1000)
        if mode == "slow": time.sleep(60)
        if mode == "exit": sys.exit(3)
        if mode == "missing": continue
    m = Chem.MolFromSmiles(s)
    if m is None or m.GetNumAtoms() == 0:
        print("nan", flush=True); continue
    nn = sum(a.GetSymbol() == "N" for a in m.GetAtoms())
    can = const or Chem.MolToSmiles(m)
    sc = float(flat) if flat else nn / m.GetNumAtoms()
    if os.environ.get("COARSE"):  # few distinct scores: a top 100 that stops moving
        sc = round(sc * 4) / 4
    print("%.6f\tcanonical=%s\tn_atoms=%d" % (sc, can, m.GetNumAtoms()), flush=True)
'''


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    pytest.importorskip("rdkit")
    p = tmp_path_factory.mktemp("scorer") / "nfrac.py"
    p.write_text(SCORER)
    return "%s %s" % (sys.executable, p)


def optimize(out, scorer, *args, env=None, check=True):
    cmd = [molgen_binary(), "optimize", "--prior", PRIOR, "--scorer", scorer, "--threads", "2",
           "--out", str(out)] + [str(a) for a in args]
    r = subprocess.run(cmd, env=dict(ENV, **(env or {})), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def resume(out, scorer, *args, env=None):
    cmd = [molgen_binary(), "optimize", "--prior", PRIOR, "--scorer", scorer, "--threads", "2",
           "--resume", str(out)] + [str(a) for a in args]
    r = subprocess.run(cmd, env=dict(ENV, **(env or {})), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r


def read_scored(d):
    with open(os.path.join(str(d), "scored.csv")) as f:
        return list(csv.DictReader(f))


def read_meta(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))["__metadata__"]


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ---------------------------------------------------------------- DAP gradient

LOSS_TOL = 1e-6
GRAD_TOL = 1e-4  # test_model_torch.py's normwise criterion


DAP_CONFIGS = [
    # layers, d_model, heads, ctx, vocab, batch, scores, sigma, seed
    (2, 16, 2, 8, 10, 4, "0.1,0.9,0,0.5", 128, 1),
    (1, 12, 3, 6, 5, 5, "1,0,0.25", 128, 2),
    (3, 32, 4, 12, 26, 7, "0.3,0.7", 60, 3),
]


def _seq_nll(m, ids, lengths):
    """Summed cross-entropy of each row's targets (EOS included) under the
    torch twin m: ids [B, T] (BOS first), lengths [B] tokens with BOS."""
    import torch
    inp, tgt = ids[:, :-1], ids[:, 1:]
    kl = lengths - 1
    lg = m.logits(inp, kl)
    mask = torch.arange(inp.shape[1])[None, :] < kl[:, None]
    ce = torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1),
                                           reduction="none").reshape(tgt.shape)
    return (ce * mask).sum(1)


@pytest.mark.parametrize("cfg", DAP_CONFIGS)
def test_dap_gradient_matches_float64(tmp_path, cfg):
    torch = pytest.importorskip("torch")
    from molgen import torch_model as tm
    layers, d, heads, ctx, vocab, batch, scores, sigma, seed = cfg
    out = str(tmp_path / "dap.safetensors")
    subprocess.run([molgen_binary(), "debug-dap", "--out", out, "--layers", str(layers),
                    "--d-model", str(d), "--heads", str(heads), "--ctx-len", str(ctx), "--vocab",
                    str(vocab), "--batch", str(batch), "--scores", scores, "--sigma", str(sigma),
                    "--seed", str(seed)], check=True, env=ENV, stdout=subprocess.PIPE)
    t, meta = tm.load_safetensors(out)
    mc = tm.Config.from_json(meta["config"])

    def model(prefix):
        m = tm.MolGPT(mc).double()
        m.load_state_dict({n: torch.from_numpy(t[prefix + n].astype(np.float64))
                           for n, _ in m.named_parameters()})
        return m

    agent, prior = model(""), model("prior.")
    ids = torch.from_numpy(t["batch.ids"].astype(np.int64))
    lengths = torch.from_numpy(t["batch.lengths"].astype(np.int64))
    s = torch.from_numpy(t["batch.scores"].astype(np.float64))
    want = [float(x) for x in scores.split(",")]
    assert [float(x) for x in s] == [want[i % len(want)] for i in range(batch)]

    def seq_nll(m):
        return _seq_nll(m, ids, lengths)

    with torch.no_grad():
        prior_ll = -seq_nll(prior)
    agent_ll = -seq_nll(agent)
    loss = ((prior_ll + sigma * s - agent_ll) ** 2).mean()
    loss.backward()
    assert abs(float(meta["loss"]) - loss.item()) / loss.item() <= LOSS_TOL
    for name, p in agent.named_parameters():
        g_t = p.grad.numpy()
        g_c = t["grad." + name].astype(np.float64)
        scale = np.abs(g_t).max()
        assert scale > 0, name
        assert np.abs(g_c - g_t).max() / scale <= GRAD_TOL, name


def test_dap_step_with_replay_matches_float64(tmp_path, scorer):
    """A real step's loss rows, sampled and replayed from the memory, against
    float64 PyTorch: every row's prior NLL recomputed from the prior (the
    replayed rows' are the stored ones in molgen), the agent of the saved
    state before the step, the loss and its gradient (MOLGEN_OPT_DUMP_STEP
    dumps the step). Kills a replayed row given another molecule's prior
    NLL; the replayed rows' scores are the memory's."""
    torch = pytest.importorskip("torch")
    from molgen import torch_model as tm
    d = tmp_path / "run"
    args = ("--budget", 400, "--batch", 8, "--seed", 3, "--memory", 12, "--replay", 5,
            "--df", "none", "--sigma", 60)
    optimize(d, scorer, *args, "--stop-after", 3)
    before = str(tmp_path / "before.safetensors")
    with open(d / "agent.safetensors", "rb") as f, open(before, "wb") as g:
        g.write(f.read())
    dump = str(tmp_path / "step.safetensors")
    resume(d, scorer, "--stop-after", 4, env={"MOLGEN_OPT_DUMP_STEP": dump})
    t, meta = tm.load_safetensors(dump)
    a, ameta = tm.load_safetensors(before)
    p, _ = tm.load_safetensors(PRIOR)
    mc = tm.Config.from_json(meta["config"])
    state = json.loads(ameta["optimize"])
    memory = {m: sc for m, sc in state["memory"]}
    rmol = [int(x) for x in t["rows.replay_mol"]]
    assert len(rmol) == 5 and len(set(rmol)) == 5 and all(m in memory for m in rmol)
    sc = t["rows.scores"].astype(np.float64)
    B = len(sc) - len(rmol)
    assert list(sc[B:]) == [memory[m] for m in rmol]

    def model(tensors):
        m = tm.MolGPT(mc).double()
        m.load_state_dict({n: torch.from_numpy(tensors[n].astype(np.float64))
                           for n, _ in m.named_parameters()})
        return m

    agent, prior = model(a), model(p)
    ids = torch.from_numpy(t["rows.ids"].astype(np.int64))
    lengths = torch.from_numpy(t["rows.lengths"].astype(np.int64))
    use = torch.from_numpy(t["rows.use"]) > 0
    assert bool(use[B:].all())

    def seq_nll(m):
        return _seq_nll(m, ids, lengths)

    with torch.no_grad():
        prior_ll = -seq_nll(prior)
    agent_ll = -seq_nll(agent)
    sigma = float(meta["sigma"])
    dd = (prior_ll + sigma * torch.from_numpy(sc) - agent_ll)[use]
    loss = (dd ** 2).mean()
    loss.backward()
    assert abs(float(meta["loss"]) - loss.item()) / loss.item() <= LOSS_TOL  # measured 1.2e-7
    for name, q in agent.named_parameters():
        g_t = q.grad.numpy()
        g_c = t["grad." + name].astype(np.float64)
        scale = np.abs(g_t).max()
        assert scale > 0, name
        assert np.abs(g_c - g_t).max() / scale <= GRAD_TOL, name


# ---------------------------------------------------------------- learning, budget, cache

def test_improves_the_score(tmp_path, scorer):
    d = tmp_path / "run"
    r = optimize(d, scorer, "--budget", 480, "--batch", 32, "--seed", 1, "--lr", "5e-4")
    rows = read_scored(d)
    by_step = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), []).append(float(row["score"]))
    steps = sorted(by_step)
    first = np.mean([x for s in steps[:3] for x in by_step[s]])
    last = np.mean([x for s in steps[-4:-1] for x in by_step[s]])  # the last step is cut by the budget
    assert last > first + 0.05, (first, last)
    # the scores are the share of N atoms, recomputed here by RDKit
    from rdkit import Chem
    for row in rows[:50]:
        m = Chem.MolFromSmiles(row["smiles"])
        assert abs(float(row["score"]) - sum(a.GetSymbol() == "N" for a in m.GetAtoms())
                   / m.GetNumAtoms()) < 1e-6
        assert row["canonical"] == Chem.MolToSmiles(m)
    assert "step 1 " in r.stderr and "calls" in r.stderr and "ETA" in r.stderr


def test_budget_exact_and_cache(tmp_path, scorer):
    d, log = tmp_path / "run", tmp_path / "log.txt"
    optimize(d, scorer, "--budget", 200, "--batch", 24, "--seed", 3, env={"LOG": str(log)})
    rows = read_scored(d)
    assert [int(r["call"]) for r in rows] == list(range(1, 201))
    assert len({r["canonical"] for r in rows}) == 200
    sent = log.read_text().splitlines()
    assert len(sent) == len(set(sent))  # a SMILES once asked is never asked again
    summary = json.loads((d / "summary.json").read_text())
    assert summary["calls"] == 200 and summary["stop"] == "budget"
    best = [l.split("\t") for l in (d / "best.smi").read_text().splitlines()]
    assert len(best) == 100
    scores = sorted((float(r["score"]) for r in rows), reverse=True)
    assert [float(b[1]) for b in best] == pytest.approx(scores[:100], abs=1e-9)
    assert summary["top10"] == pytest.approx(np.mean(scores[:10]), abs=1e-6)


def test_canonical_key_costs_one_call(tmp_path, scorer):
    """Every molecule is given one canonical: one call, then all served from
    the cache; no new molecules, so the mode-collapse stop ends the run."""
    d = tmp_path / "run"
    r = optimize(d, scorer, "--budget", 50, "--batch", 8, "--collapse-steps", 4,
                 env={"CONST_CANONICAL": "CCO"})
    rows = read_scored(d)
    assert len(rows) == 1 and rows[0]["canonical"] == "CCO"
    s = json.loads((d / "summary.json").read_text())
    assert s["calls"] == 1 and s["stop"] == "collapse" and s["steps"] == 5
    assert "stop: collapse" in r.stderr


def test_patience_stop(tmp_path, scorer):
    """mol_opt's convergence stop: every molecule scores 0.25, so the top-100
    mean never moves; counted only past 1,000 calls, the run ends on the
    --patience'th step after the first step that passes 1,000 calls (read
    from scored.csv), and a run interrupted inside the plateau resumes to the
    same stop."""
    d = tmp_path / "run"
    optimize(d, scorer, "--batch", 64, "--budget", 3000, "--patience", 3, "--seed", 2,
             env={"CONST_SCORE": "0.25"})
    rows = read_scored(d)
    calls_by_step = {}
    for r in rows:
        calls_by_step[int(r["step"])] = max(calls_by_step.get(int(r["step"]), 0), int(r["call"]))
    assert min(calls_by_step) == 0  # scored.csv's step: 0 for the first step
    first = min(s for s, c in calls_by_step.items() if c > 1000) + 1  # 1-based, as "steps"
    s = json.loads((d / "summary.json").read_text())
    assert s["stop"] == "patience" and s["steps"] == first + 2 and 1000 < s["calls"] < 3000
    d2 = tmp_path / "cut"
    optimize(d2, scorer, "--batch", 64, "--budget", 3000, "--patience", 3, "--seed", 2,
             "--stop-after", first + 1, env={"CONST_SCORE": "0.25"})
    assert json.loads((d2 / "summary.json").read_text())["stop"] == "stop-after"
    resume(d2, scorer, env={"CONST_SCORE": "0.25"})
    s2 = json.loads((d2 / "summary.json").read_text())
    assert (s2["stop"], s2["steps"], s2["calls"]) == ("patience", s["steps"], s["calls"])


def test_patience_waits_for_100_hits(tmp_path, scorer):
    """The top-100 mean says a run has converged only once 100 molecules
    scored above 0: a run in which every molecule scores 0 (an unchanged
    top 100 of zeros) goes on to the budget, where the same run scoring
    0.25 stops on --patience."""
    d = tmp_path / "zero"
    optimize(d, scorer, "--batch", 64, "--budget", 1400, "--patience", 2, "--seed", 2,
             env={"CONST_SCORE": "0"})
    s = json.loads((d / "summary.json").read_text())
    assert (s["stop"], s["calls"]) == ("budget", 1400)
    optimize(tmp_path / "quarter", scorer, "--batch", 64, "--budget", 1400, "--patience", 2,
             "--seed", 2, env={"CONST_SCORE": "0.25"})
    s = json.loads((tmp_path / "quarter" / "summary.json").read_text())
    assert s["stop"] == "patience" and s["calls"] < 1400


def test_patience_stopped_run_goes_on_with_another_patience(tmp_path, scorer):
    """--patience only decides when a run ends: the run it stopped, resumed
    with --patience 0, goes on to the budget as the run without the stop
    does, bit for bit (PMO pads a stopped run's AUC with its last top-10, so
    this is how the stop is measured without running the steps again)."""
    env = {"CONST_SCORE": "0.25"}
    a, b = tmp_path / "straight", tmp_path / "stopped"
    optimize(a, scorer, "--batch", 64, "--budget", 1400, "--seed", 2, env=env)
    optimize(b, scorer, "--batch", 64, "--budget", 1400, "--seed", 2, "--patience", 2, env=env)
    s = json.loads((b / "summary.json").read_text())
    assert s["stop"] == "patience" and s["calls"] < 1400
    resume(b, scorer, "--patience", 0, env=env)
    same_run(b, a)
    s = json.loads((b / "summary.json").read_text())
    assert (s["stop"], s["calls"], s["options"]["patience"]) == ("budget", 1400, 0)


def test_patience_replayed_from_a_run_to_the_budget(tmp_path, scorer):
    """bench/pmo_patience.py reads off a run that went to the budget where
    --patience P would have stopped it: the runs with P = 1, 2 and 4 (real
    stops, the N-fraction scorer rounded to quarters so the top 100 fills
    and stops moving) end at the calls it replays, with the AUC of their
    scored.csv."""
    sys.path.insert(0, os.path.join(REPO, "python"))
    from molgen import pmo
    from molgen_bin import load_file
    pat = load_file("bench_pmo_patience", os.path.join(REPO, "bench", "pmo_patience.py"))
    env = {"COARSE": "1"}
    full = tmp_path / "full"
    optimize(full, scorer, "--batch", 64, "--budget", 2600, "--seed", 3, env=env)
    steps = pat.read_steps(str(full / "scored.csv"))
    stopped = 0
    for p in (1, 2, 4):
        d = tmp_path / ("p%d" % p)
        optimize(d, scorer, "--batch", 64, "--budget", 2600, "--seed", 3, "--patience", p, env=env)
        s = json.loads((d / "summary.json").read_text())
        stop = pat.replay(steps, p)
        auc, calls = pat.auc_until(steps, stop, 2600)
        assert (stop is None) == (s["stop"] == "budget"), (p, stop, s["stop"])
        assert calls == s["calls"], (p, calls, s["calls"])
        assert auc == pmo.auc(pmo.read_scored_csv(str(d / "scored.csv")), budget=2600)
        stopped += s["stop"] == "patience"
    assert stopped >= 2  # stops replayed, not only the budget


def test_signal_during_a_slow_scorer(tmp_path, scorer, straight):
    """SIGTERM while molgen waits for a scorer that takes a minute for one
    molecule: the run stops within seconds (not after the answer), exits
    128 + 15 with the step's start saved, and --resume gives the straight
    run bit for bit."""
    d, log = tmp_path / "run", tmp_path / "log.txt"
    cmd = [molgen_binary(), "optimize", "--prior", PRIOR, "--scorer", scorer, "--threads", "2",
           "--out", str(d)] + [str(a) for a in RUN]
    p = subprocess.Popen(cmd, env=dict(ENV, FAULT="slow", AT="40", LOG=str(log)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None and (
            not log.exists() or len(log.read_text().splitlines()) < 40):
        time.sleep(0.1)  # until the scorer holds molecule 40 (it then sleeps a minute)
    time.sleep(0.3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert time.monotonic() - t0 < 10, err
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by signal 15 waiting for the scorer" in err, err
    assert "continue with --resume" in err, err
    resume(d, scorer)
    same_run(d, straight)


def test_bf16_run_resumes_bit_exact(tmp_path, scorer, straight):
    """--dtype bf16 (the products and the sampler in bf16, fp32 accumulation):
    a run stopped after step 5 and resumed equals the straight bf16 run bit
    for bit; it is not the fp32 run (the dtype is used), --resume with
    another --dtype is refused, and the agent learns as in fp32 (its mean
    score is within a few hundredths of the fp32 run's)."""
    a, b = tmp_path / "a", tmp_path / "b"
    optimize(a, scorer, *RUN, "--dtype", "bf16")
    optimize(b, scorer, *RUN, "--dtype", "bf16", "--stop-after", 5)
    r = subprocess.run([molgen_binary(), "optimize", "--prior", PRIOR, "--scorer", scorer,
                        "--resume", str(b), "--dtype", "fp32"], env=ENV, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 1 and "another --dtype" in r.stderr, r.stderr
    resume(b, scorer)
    same_run(a, b)
    assert (a / "scored.csv").read_text() != (straight / "scored.csv").read_text()
    mean = lambda d: np.mean([float(x["score"]) for x in read_scored(d)])
    assert abs(mean(a) - mean(straight)) < 0.05, (mean(a), mean(straight))


def test_augmented_memory_uses_randomize(tmp_path, scorer):
    d, log = tmp_path / "run", tmp_path / "log.txt"
    optimize(d, scorer, "--budget", 96, "--batch", 16, "--augmented-memory", 2,
             env={"LOG": str(log)})
    reqs = [l for l in log.read_text().splitlines() if l.startswith("!randomize")]
    assert reqs and len(read_scored(d)) == 96


@pytest.mark.parametrize("answer,words", [
    ("1", "is not a SMILES"),          # was: the agent trained on "1" and sampled it
    ("CCO", "is another molecule"),    # a SMILES, not the molecule asked
    ("C1CC1C", "is another molecule"),
])
def test_wrong_randomize_answer_is_an_error(tmp_path, scorer, answer, words):
    d = tmp_path / "run"
    r = optimize(d, scorer, "--budget", 96, "--batch", 16, "--augmented-memory", 2,
                 env={"BAD_RANDOMIZE": answer}, check=False)
    assert r.returncode == 1, r.stderr
    first = r.stderr.strip().splitlines()
    first = [l for l in first if not l.startswith("step ")][0]
    assert "!randomize line '%s\t%s'" % (answer, answer) in first and words in first, first
    assert "spelling 1 '%s'" % answer in first, first


# ---------------------------------------------------------------- resume and faults

RUN = ("--budget", 240, "--batch", 16, "--seed", 5, "--save-every", 4)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, scorer):
    d = tmp_path_factory.mktemp("straight") / "run"
    optimize(d, scorer, *RUN)
    return d


def same_run(a, b):
    assert (a / "scored.csv").read_text() == (b / "scored.csv").read_text()
    assert digest(a / "agent.safetensors") == digest(b / "agent.safetensors")
    assert (a / "best.smi").read_text() == (b / "best.smi").read_text()


def test_resume_is_bit_exact(tmp_path, scorer, straight):
    d = tmp_path / "run"
    r = optimize(d, scorer, *RUN, "--stop-after", 6)
    assert "stop: stop-after" in r.stderr
    assert {int(x["step"]) for x in read_scored(d)} == set(range(6))
    resume(d, scorer)
    same_run(d, straight)


def drop_saved_options(path, keys):
    """Rewrites the state file without the saved options in keys: a state
    written before those settings existed."""
    with open(path, "rb") as f:
        head = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        body = f.read()
    ck = json.loads(head["__metadata__"]["optimize"])
    for k in keys:
        del ck["options"][k]
    head["__metadata__"]["optimize"] = json.dumps(ck)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + body)


def test_state_before_constrain_method_resumes_as_mask(tmp_path, scorer):
    """States written before --constrain-method sampled with masking: one
    without the key resumes so, bit for bit."""
    a, b = tmp_path / "straight", tmp_path / "old"
    optimize(a, scorer, *RUN, "--constrain-method", "mask")
    optimize(b, scorer, *RUN, "--constrain-method", "mask", "--stop-after", 6)
    drop_saved_options(b / "agent.safetensors", ["constrain_method"])
    resume(b, scorer)
    same_run(b, a)
    assert json.loads((b / "summary.json").read_text())["options"]["constrain_method"] == "mask"


ZINC_PRIOR = os.path.join(REPO, "models", "molgen-zinc.safetensors")
ZINC_MAX_HEAVY = 38  # the largest molecule of zinc250k_240k.smi (RDKit)


@pytest.mark.parametrize("seed", [1, 3])
def test_agent_samples_do_not_derail(tmp_path, scorer, seed):
    """The agent's batch is sampled as molgen sample's default (reject): the
    ZINC prior's first batch of 256 stays within the data's sizes. Masking
    the refused tokens keeps molecules that derailed (93-115 heavy atoms in
    these batches), which cost calls and, on PMO's hop tasks, minutes of
    the oracle's pharmacophore fingerprint each."""
    def largest(d, *args):
        r = subprocess.run([molgen_binary(), "optimize", "--prior", ZINC_PRIOR, "--scorer", scorer,
                            "--threads", "2", "--out", str(d), "--budget", "2000", "--batch", "256",
                            "--max-steps", "1", "--seed", str(seed)] + list(args),
                           env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr
        rows = read_scored(d)
        assert len(rows) >= 250
        return max(int(x["components"].split("n_atoms=")[1]) for x in rows)
    assert largest(tmp_path / "default") <= ZINC_MAX_HEAVY + 5
    assert largest(tmp_path / "mask", "--constrain-method", "mask") > 2 * ZINC_MAX_HEAVY


def test_replay_loops(tmp_path, scorer, straight):
    """--replay-loops L (Genetic GFN's experience loop): L more Adam updates
    per step on memory molecules, after the step's own. The first batch is
    the run without loops' (the loops come after it), the second is not (the
    agent moved); the state counts 1 + L updates a step; a run stopped and
    resumed is the straight run, bit for bit."""
    a, b = tmp_path / "loops", tmp_path / "cut"
    optimize(a, scorer, *RUN, "--replay-loops", 3)
    rows, plain = read_scored(a), read_scored(straight)
    first = lambda rs, k: [r["smiles"] for r in rs if r["step"] == str(k)]
    assert first(rows, 0) == first(plain, 0) and first(rows, 1) != first(plain, 1)
    ck = json.loads(read_meta(a / "agent.safetensors")["optimize"])
    assert ck["adam_step"] == 4 * ck["step"] and ck["options"]["replay_loops"] == 3
    optimize(b, scorer, *RUN, "--replay-loops", 3, "--stop-after", 5)
    resume(b, scorer)
    same_run(b, a)
    r = optimize(tmp_path / "bad", scorer, "--replay", 0, "--replay-loops", 2, check=False)
    assert r.returncode != 0 and "replay loops need replayed molecules" in r.stderr, r.stderr


@pytest.mark.parametrize("mode,words", [
    ("garbage", ["'oops not a number'", "does not start with a number"]),
    ("inf", ["'inf'", "outside [0, 1]"]),
    ("big", ["'1.5'", "outside [0, 1] (refused, not clipped)"]),
    ("neg", ["'-0.1'", "outside [0, 1]"]),
    ("hang", ["no answer", "within 6 s"]),
    ("exit", ["exited with status 3"]),
    ("missing", ["no answer", "within 6 s"]),
])
def test_scorer_fault_is_clear_and_resumable(tmp_path, scorer, straight, mode, words):
    d, log = tmp_path / "run", tmp_path / "log.txt"
    r = optimize(d, scorer, *RUN, "--scorer-timeout", 6, check=False,
                 env={"FAULT": mode, "AT": "40", "LOG": str(log)})
    assert r.returncode == 1, r.stderr
    err = r.stderr.strip().splitlines()
    msg = [l for l in err if l.startswith("molgen optimize: ")]
    assert len(msg) == 2, r.stderr
    for w in words:
        assert w in msg[0], msg[0]
    # the message names the molecule: one the scorer was asked in the failed batch
    asked = log.read_text().splitlines()
    named = msg[0].split("of the batch '")[1].split("'")[0]
    scored = read_scored(d)
    assert named in asked and named not in {x["smiles"] for x in scored}, msg[0]
    assert "continue with --resume" in msg[1]
    # the state of the failing step's start: whole steps only, saved with it
    steps = sorted({int(x["step"]) for x in scored})
    assert steps == list(range(len(steps))) and len(steps) >= 1
    ck = json.loads(read_meta(d / "agent.safetensors")["optimize"])
    assert ck["step"] == len(steps) and len(ck["molecules"]) == len(scored)
    resume(d, scorer)
    same_run(d, straight)


def test_refusals(tmp_path, scorer, straight):
    r = optimize(tmp_path / "a", scorer, "--budget", 0, check=False)
    assert r.returncode == 2 and "bad value '0' for --budget" in r.stderr
    r = subprocess.run([molgen_binary(), "optimize", "--prior", PRIOR, "--resume", str(straight),
                        "--scorer", scorer, "--seed", "6"], env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    assert r.returncode == 1 and "another --seed" in r.stderr, r.stderr


def test_rows_without_eos_are_left_out(tmp_path, scorer):
    """Seed 0's first masked batch of 64 holds a molecule that fills the
    context without EOS: it is left out of the loss (a padded dummy row), not an
    error (the first version fed the forward uninitialised ids)."""
    d = tmp_path / "run"
    optimize(d, scorer, "--budget", 200, "--batch", 64, "--seed", 0, "--max-steps", 1,
             "--constrain-method", "mask")
    s = json.loads((d / "summary.json").read_text())
    assert s["steps"] == 1 and s["stop"] == "max-steps" and 50 <= s["calls"] <= 64



# ---------------------------------------------------------------- --preset pmo

# mol_opt's REINVENT (main/reinvent/hparams_default.yaml): sigma 500, learning
# rate 5e-4, experience replay 24 from a memory of 100, no diversity filter
# (summary.json's df: 0 none, 2 scaffold).
PMO = {"sigma": 500.0, "lr": 5e-4, "memory": 100, "replay": 24, "df": 0, "patience": 20,
       "helper": "on", "ga_offspring": 16, "rank_coef": 0.01, "replay_loops": 2}
DEFAULTS = {"sigma": 128.0, "lr": 1e-4, "memory": 50, "replay": 10, "df": 2, "patience": 0,
            "helper": "off", "ga_offspring": 0, "rank_coef": 0.0, "replay_loops": 0}


def options_of(d, scorer, *args):
    optimize(d, scorer, "--budget", 16, "--batch", 8, "--max-steps", 1, *args)
    o = json.loads((d / "summary.json").read_text())["options"]
    return {k: o[k] for k in PMO}


def test_preset_pmo_sets_mol_opts_settings(tmp_path, scorer):
    assert options_of(tmp_path / "default", scorer) == DEFAULTS
    assert options_of(tmp_path / "pmo", scorer, "--preset", "pmo") == PMO
    # options given win over the preset, before or after it
    assert options_of(tmp_path / "mixed", scorer, "--sigma", 200, "--preset", "pmo",
                      "--df", "scaffold") == dict(PMO, sigma=200.0, df=2)
    r = optimize(tmp_path / "bad", scorer, "--preset", "reinvent", check=False)
    assert r.returncode == 2 and "bad value 'reinvent' for --preset" in r.stderr, r.stderr
    # a resumed run keeps its saved options
    r = subprocess.run([molgen_binary(), "optimize", "--prior", PRIOR, "--resume",
                        str(tmp_path / "pmo"), "--scorer", scorer, "--preset", "pmo"], env=ENV,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 2 and "--preset with --resume" in r.stderr, r.stderr
