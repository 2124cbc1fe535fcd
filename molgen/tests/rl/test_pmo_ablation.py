"""bench/pmo_ablation.py: the table pairs the two folders' runs task by task
(differences and sums by hand) and --svg draws one chart per task with both
runs' AUCs, worked out here from PMO's rule (a stopped run's last top-10
carried to the budget)."""
import json
import os

from molgen_bin import REPO, load_file


def load():
    return load_file("bench_pmo_ablation", os.path.join(REPO, "bench", "pmo_ablation.py"))


def make_run(root, task, auc, score, calls, stop):
    d = os.path.join(root, "b10000", "molgen", task, "s0")
    os.makedirs(d)
    json.dump({"auc_top10": auc, "calls": calls, "stop": stop, "wall_s": 10.0},
              open(os.path.join(d, "bench.json"), "w"))
    with open(os.path.join(d, "scored.csv"), "w") as f:
        f.write("call,step,smiles,canonical,score\n")
        for i in range(calls):
            f.write("%d,0,C%d,C%d,%r\n" % (i, i, i, score))


def test_table_and_curves(tmp_path, capsys):
    base, lever = str(tmp_path / "base"), str(tmp_path / "lever")
    make_run(base, "qed", 0.4, 0.5, 10000, "budget")
    make_run(lever, "qed", 0.7, 0.8, 5000, "patience")  # stopped: padded to 10,000
    make_run(base, "median1", 0.2, 0.5, 100, "budget")  # only in base: not in the table
    svg = str(tmp_path / "c.svg")
    load().main([base, lever, "--labels", "A", "B", "--svg", svg])
    out = capsys.readouterr().out
    assert "| qed | 0.400 | 0.700 | +0.300 | 10000 (budget) / 5000 (patience) | 10 / 10 |" in out
    assert "| **sum (1 tasks)** | **0.400** | **0.700** | **+0.300** | | |" in out
    text = open(svg).read()
    # a constant score s: the top-10 is s from call 10 on; PMO logs it every
    # 100 calls from 0, so the area is 100 s / 2 + 9,900 s, the stopped run's
    # flat part carried to 10,000 calls
    assert "qed: AUC %.3f against %.3f" % (0.5 * 9950 / 10000, 0.8 * 9950 / 10000) in text
    assert "median1" not in text
    assert text.count("stroke-dasharray") == 1  # the stopped run's padding only
