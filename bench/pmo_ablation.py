#!/usr/bin/env python3
"""One lever's ablation on PMO: two run folders of bench/pmo.py (the same
tasks, seed, budget and prior, one setting apart) side by side, task by
task: AUC top-10 of each, the difference, the calls and stop of each run,
and the wall seconds. A markdown table on stdout, the tasks both folders
finished, and the sums over them.

    /usr/bin/python3 bench/pmo_ablation.py BASE_RUNS LEVER_RUNS [--seed 0] [--budget 10000]
        [--labels "--preset pmo" "+ GA"]

e.g. bench/results/pmo-zinc (no GA) against bench/results/pmo-zinc-ga:
docs/pmo.md's GA ablation."""
import argparse
import json
import os


def bench(runs, budget, task, seed):
    p = os.path.join(runs, "b%d" % budget, "molgen", task, "s%d" % seed, "bench.json")
    return json.load(open(p)) if os.path.exists(p) else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("lever")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=10000)
    ap.add_argument("--labels", nargs=2, default=["`--preset pmo`", "+ GA (16 children, rank 0.01)"])
    a = ap.parse_args(argv)
    root = os.path.join(a.lever, "b%d" % a.budget, "molgen")
    tasks = sorted(os.listdir(root)) if os.path.isdir(root) else []
    print("| task | %s | %s | difference | calls (stop) | s/run |" % tuple(a.labels))
    print("| --- | --- | --- | --- | --- | --- |")
    n, sb, sg = 0, 0.0, 0.0
    for t in tasks:
        b, g = bench(a.base, a.budget, t, a.seed), bench(a.lever, a.budget, t, a.seed)
        if not b or not g:
            continue
        n, sb, sg = n + 1, sb + b["auc_top10"], sg + g["auc_top10"]
        print("| %s | %.3f | %.3f | %+.3f | %d (%s) / %d (%s) | %.0f / %.0f |" % (
            t, b["auc_top10"], g["auc_top10"], g["auc_top10"] - b["auc_top10"], b["calls"],
            b["stop"], g["calls"], g["stop"], b["wall_s"], g["wall_s"]))
    print("| **sum (%d tasks)** | **%.3f** | **%.3f** | **%+.3f** | | |" % (n, sb, sg, sg - sb))


if __name__ == "__main__":
    main()
