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


def test_patience_replay_counts_steps_with_no_new_molecule(tmp_path):
    """bench/pmo_patience.py: a step whose batch was all in the cache writes
    no row to scored.csv but is a step whose top 100 did not move, as
    molgen/rl/optimize.c counts it; here steps 1, 2 (no rows) and 3 make
    --patience 3 stop after step 3, and summary.json's steps adds the empty
    steps after the last row."""
    pat = load_file("bench_pmo_patience", os.path.join(REPO, "bench", "pmo_patience.py"))
    path = str(tmp_path / "scored.csv")
    with open(path, "w") as f:
        f.write("call,step,smiles,canonical,score\n")
        for i in range(1100):  # past 1,000 molecules and 100 hits after step 0
            f.write("%d,0,C%d,C%d,0.5\n" % (i + 1, i, i))
        f.write("1101,1,N1,N1,0.1\n1102,3,N3,N3,0.1\n1103,4,N4,N4,0.9\n")
    steps = pat.read_steps(path)
    assert [s for s, _ in steps] == [0, 1, 2, 3, 4] and steps[2][1] == []
    stop = pat.replay(steps, 3)
    assert stop == 3 and pat.auc_until(steps, stop, 10000)[1] == 1102
    assert pat.replay(steps, 4) is None  # step 4 moves the top 100
    # four steps with no new molecule after the last row (summary.json's
    # steps 9): the 4th plateau step after step 4 ends it at P = 4
    steps = pat.read_steps(path, nsteps=9)
    assert len(steps) == 9 and pat.replay(steps, 4) == 8
    assert pat.replay(steps, 5) is None
