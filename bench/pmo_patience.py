#!/usr/bin/env python3
"""What `molgen optimize --patience P` would have scored, read off runs that
went on to the budget (`bench/pmo.py --resume --resume-args "--patience 0"`
on a copy of stopped runs: bit for bit the run without the stop).

The stop is replayed from DIR/scored.csv as molgen/rl/optimize.c decides it:
after each step, a step whose commit left the top-100 mean exactly as it was
counts towards the plateau (only once more than 1,000 molecules are scored
and, from bb119a6 on, 100 of them above 0; `--no-hits-rule` for binaries
before it), any other step resets it; the run stops after the step that
brings the count to P. The AUC is PMO's (molgen.pmo) over the calls up to
that step, padded with its last top-10. Scores are read as scored.csv
prints them (%.10g): a molecule that enters the top 100 within 1e-10 of
the one it displaces would read as a plateau step the run did not count
(none in the runs checked: every stop replayed to the call).

    bench/pmo_patience.py RUNS [--seed 0] [--patience 5,10,20,0] [--markdown]

RUNS is a bench/pmo.py --runs folder; every task under b10000/molgen/ is
read. `--check STOPPED_RUNS` also compares the stop replayed at each
stopped run's own --patience with where it really ended (its calls): exit
status 1 if any differs."""
import argparse
import csv
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from molgen import pmo  # noqa: E402


def read_steps(path, nsteps=None):
    """scored.csv -> [(step, [(canonical, score)] in call order)] for steps
    0, 1, ...: a step that scored no new molecule (its batch all in the
    cache) is there with no rows, since it counts towards the plateau too;
    nsteps (summary.json's steps) adds such steps after the last row."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    rows.sort(key=lambda r: int(r["call"]))
    by_step = {}
    for r in rows:
        key = r.get("canonical") or r["smiles"]
        by_step.setdefault(int(r["step"]), []).append((key, pmo._float_or_none(r["score"])))
    n = max(by_step) + 1 if by_step else 0
    if nsteps is not None:
        n = max(n, nsteps)
    return [(s, by_step.get(s, [])) for s in range(n)]


def top_mean(sorted_desc, n):
    k = min(n, len(sorted_desc))
    if not k:
        return 0.0
    t = 0.0
    for x in sorted_desc[:k]:  # summed best first, as mg_opt_top_mean does
        t += x
    return t / k


def replay(steps, patience, hits_rule=True, min_calls=1000, min_hits=100):
    """-> (index of the step the run stops after, or None for the budget);
    min_calls and min_hits are the rule's 1,000 calls and 100 hits."""
    seen, scores, run, hits = set(), [], 0, 0
    for i, (_, recs) in enumerate(steps):
        before = top_mean(scores, 100)
        for key, score in recs:
            if not key or score is None or math.isnan(score) or key in seen:
                continue
            seen.add(key)
            scores.append(score)
            hits += score > 0
        scores.sort(reverse=True)
        plateau = len(scores) > min_calls and (hits >= min_hits or not hits_rule) and \
            top_mean(scores, 100) == before
        run = run + 1 if plateau else 0
        if patience > 0 and run >= patience:
            return i
    return None


def auc_until(steps, stop, budget):
    recs = [r for _, rs in steps[: (stop + 1 if stop is not None else len(steps))] for r in rs]
    calls = pmo.unique_calls(recs)
    return pmo.auc(calls, budget=budget), min(len(calls), budget)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=10000)
    ap.add_argument("--patience", default="5,10,20,0",
                    help="comma-separated values; 0: no stop")
    ap.add_argument("--no-hits-rule", action="store_true",
                    help="binaries before bb119a6: no 100-hits condition")
    ap.add_argument("--check", metavar="STOPPED_RUNS",
                    help="the stopped runs these went on from: their calls at the stop")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    ps = [int(x) for x in a.patience.split(",")]
    base = os.path.join(a.runs, "b%d" % a.budget, "molgen")
    head = ["task"] + ["P=%d" % p if p else "no stop" for p in ps]
    if a.check:
        head.append("replayed / real stop (calls)")
    rows, sums, bad = [], [0.0] * len(ps), 0
    for task in sorted(os.listdir(base)):
        d = os.path.join(base, task, "s%d" % a.seed)
        path = os.path.join(d, "scored.csv")
        if not os.path.exists(os.path.join(d, "bench.json")) or not os.path.exists(path):
            continue
        summ = os.path.join(d, "summary.json")
        nsteps = json.load(open(summ)).get("steps") if os.path.exists(summ) else None
        steps = read_steps(path, nsteps)
        cells = [task]
        for j, p in enumerate(ps):
            stop = replay(steps, p, not a.no_hits_rule)
            v, n = auc_until(steps, stop, a.budget)
            sums[j] += v
            cells.append("%.3f (%d)" % (v, n))
        if a.check:
            rd = os.path.join(a.check, "b%d" % a.budget, "molgen", task, "s%d" % a.seed)
            ref = json.load(open(os.path.join(rd, "bench.json")))
            p0 = json.load(open(os.path.join(rd, "summary.json")))["options"]["patience"]
            _, n = auc_until(steps, replay(steps, p0, not a.no_hits_rule), a.budget)
            real = ref.get("calls")
            bad += real is not None and n != real
            cells.append("%d / %s" % (n, real))
        rows.append(cells)
    rows.append(["**sum (%d tasks)**" % len(rows)] + ["**%.3f**" % s for s in sums] +
                ([""] if a.check else []))
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        for r in [head] + rows:
            print("  ".join(r))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
