"""bench/pmo.py's published columns: every method's 23 per-task values add
up to the 23-task sum its source prints (a transcription check: one value
copied wrong moves the sum), the 20 tasks of the table are PMO's 23 less the
three sklearn-model oracles, and --published puts the columns and their
20-task sums in the table."""
import os
import types

from molgen_bin import REPO, load_file


def load_pmo():
    return load_file("bench_pmo", os.path.join(REPO, "bench", "pmo.py"))


def test_sums_match_the_sources():
    pmo = load_pmo()
    for name, (source, total, vals) in pmo.PUBLISHED.items():
        assert len(vals) == 23, name
        # the sources sum unrounded means: rounding 23 values moves the sum < 0.0115
        assert abs(sum(vals.values()) - total) <= 0.003, (name, sum(vals.values()), total)
        assert set(vals) - set(pmo.TASKS) == {"drd2", "gsk3b", "jnk3"}, name
        assert source


def test_table_has_the_columns():
    pmo = load_pmo()
    results = []
    for t in pmo.TASKS:
        results.append({"engine": "molgen", "task": t, "seed": 0, "auc_top10": 0.5,
                        "calls": 10000, "wall_s": 1.0, "stop": "budget"})
    a = types.SimpleNamespace(published=True, tasks=pmo.TASKS, budget=10000, jobs=1)
    tab, note = pmo.table(results, a)
    lines = tab.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    for name in pmo.PUBLISHED:
        assert name in head and name in note
    last = [c.strip().strip("*") for c in lines[-1].strip("|").split("|")]
    for name, (_, _, vals) in pmo.PUBLISHED.items():
        want = sum(vals[t] for t in pmo.TASKS)
        assert abs(float(last[head.index(name)]) - want) < 5e-4
    assert abs(float(last[head.index("molgen optimize")]) - 10.0) < 5e-4
    # the per-task row carries the source's value
    row = [c.strip() for c in lines[2].strip("|").split("|")]
    assert row[head.index("Genetic GFN")] == "%.3f" % pmo.PUBLISHED["Genetic GFN"][2][pmo.TASKS[0]]
