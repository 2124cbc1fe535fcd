#!/usr/bin/env python3
"""One lever's ablation on PMO: two run folders of bench/pmo.py (the same
tasks, seed, budget and prior, one setting apart) side by side, task by
task: AUC top-10 of each, the difference, the calls and stop of each run,
and the wall seconds. A markdown table on stdout, the tasks both folders
finished, and the sums over them.

    /usr/bin/python3 bench/pmo_ablation.py BASE_RUNS LEVER_RUNS [--seed 0] [--budget 10000]
        [--labels "--preset pmo" "+ GA"] [--svg OUT.svg [--svg-tasks T1,T2]]

--svg also draws each task's top-10 against the calls, both runs on one
chart (PMO's logged curve, whose area is the AUC), from the runs' scored.csv
(the run folders, not bench/results' copies, which keep only bench.json).

e.g. bench/results/pmo-zinc (no GA) against bench/results/pmo-zinc-ga:
docs/pmo.md's GA ablation."""
import argparse
import html
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def bench(runs, budget, task, seed):
    p = os.path.join(runs, "b%d" % budget, "molgen", task, "s%d" % seed, "bench.json")
    return json.load(open(p)) if os.path.exists(p) else None


def curves_svg(a, tasks, out):
    """out: one chart per task (top-10 against calls, base and lever),
    stacked, each titled with the task and the two AUCs."""
    from molgen import pmo
    from molgen.report import Chart
    colors = ("#1f77b4", "#d62728")
    w, h, title = 900, 250, 22
    parts = []
    for t in tasks:
        series = []
        for runs, label, color in zip((a.base, a.lever), a.labels, colors):
            p = os.path.join(runs, "b%d" % a.budget, "molgen", t, "s%d" % a.seed, "scored.csv")
            if not os.path.exists(p):
                break
            scores = pmo.read_scored_csv(p)
            series.append((label, color, [(0, 0.0)] + pmo.curve(scores, 10, a.budget),
                           pmo.auc(scores, 10, a.budget)))
        if len(series) < 2:
            continue
        ch = Chart(w, h, a.budget, 0.0, 1.0, "oracle calls", "top-10 mean", [0, 0.25, 0.5, 0.75, 1.0])
        for label, color, pts, _ in series:
            # the AUC pads a stopped run with its last top-10: drawn dashed
            ch.line(pts, color, 2.2)
            if pts[-1][0] < a.budget:
                ch.parts.append('<polyline fill="none" stroke="%s" stroke-width="1.2" '
                                'stroke-dasharray="4 3" points="%.1f,%.1f %.1f,%.1f"/>' % (
                                    color, ch.x(pts[-1][0]), ch.y(pts[-1][1]), ch.x(a.budget),
                                    ch.y(pts[-1][1])))
        ch.legend([(label, color) for label, color, _, _ in series])
        y0 = len(parts) // 2 * (h + title)
        parts.append('<text x="8" y="%d" font-size="14" font-weight="bold" fill="#222">%s: AUC %s</text>'
                     % (y0 + 16, html.escape(t), " against ".join(
                         "%.3f" % auc for _, _, _, auc in series)))
        parts.append('<svg x="0" y="%d" width="%d" height="%d">%s</svg>'
                     % (y0 + title, w, h, ch.svg().split(">", 1)[1].rsplit("</svg>", 1)[0]))
    if not parts:
        raise SystemExit("pmo_ablation.py: no task has scored.csv in both run folders")
    H = len(parts) // 2 * (h + title)
    with open(out, "w") as f:
        f.write('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">\n'
                '<rect width="%d" height="%d" fill="#fff"/>\n%s\n</svg>\n'
                % (w, H, w, H, w, H, "\n".join(parts)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("lever")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=10000)
    ap.add_argument("--labels", nargs=2, default=["`--preset pmo`", "+ GA (16 children, rank 0.01)"])
    ap.add_argument("--svg", metavar="OUT", help="also draw the top-10 curves into OUT")
    ap.add_argument("--svg-tasks", default="", help="comma-separated tasks to draw (default: all)")
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
    if a.svg:
        curves_svg(a, [t for t in a.svg_tasks.split(",") if t] or tasks, a.svg)


if __name__ == "__main__":
    main()
