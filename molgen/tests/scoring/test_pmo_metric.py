"""molgen.pmo (PMO's AUC top-n) on synthetic call logs whose AUC is worked
out by hand from mol_opt's rule: the curve starts at (0, 0), a point every
freq_log calls below n, the last point at n, trapezoids, padding with the last
value to the budget, divided by the budget."""
import math
import random

import pytest

from molgen import pmo


def brute_auc(scores, top_n, budget, freq_log):
    """The rule written out the slow way: sort every prefix at each point."""
    n = min(len(scores), budget)
    if n == 0:
        return 0.0
    ks = list(range(freq_log, n, freq_log)) + [n]
    area, pk, py = 0.0, 0, 0.0
    for k in ks:
        best = sorted(scores[:k], reverse=True)[:top_n]
        y = sum(best) / len(best)
        area += (k - pk) * (y + py) / 2
        pk, py = k, y
    return (area + (budget - n) * py) / budget


def test_constant_score_is_0995_of_it():
    # 100*(s+0)/2 + 98*100*s + 100*s = 9950 s over 10,000 calls
    assert pmo.auc([0.8] * 10000) == pytest.approx(0.995 * 0.8, abs=1e-12)
    assert pmo.auc([1.0] * 10000) == pytest.approx(0.995, abs=1e-12)


def test_linear_ramp():
    # call i scores i/1000: top(k) = (k - 4.5)/1000 for k >= 10; piecewise
    # linear, so the trapezoids are the integral: 0.5*100*0.0955
    # + int_100^1000 (x - 4.5)/1000 dx = 4.775 + 495 - 4.05 = 495.725
    scores = [i / 1000 for i in range(1, 1001)]
    assert pmo.auc(scores, 10, 1000, 100) == pytest.approx(0.495725, abs=1e-12)


def test_early_stop_padded_with_last_top10():
    # 550 calls of 0.6, budget 1000: 50 s + 4*100 s + 50 s (the partial
    # interval 500 -> 550) + 450 s of padding = 950 s
    assert pmo.auc([0.6] * 550, 10, 1000, 100) == pytest.approx(0.95 * 0.6, abs=1e-12)
    # without padding (finish=False) only the 550 calls' area: 500 s / 1000
    assert pmo.auc([0.6] * 550, 10, 1000, 100, finish=False) == pytest.approx(0.3, abs=1e-12)


def test_step_change_and_partial_first_interval():
    # 100 calls at 0, then 0.5 from call 101: top10(100) = 0, top10(200) = 0.5
    # ... area = 0 + 100*0.25 + 8*100*0.5 = 425 -> 0.425 (budget 1000)
    assert pmo.auc([0.0] * 100 + [0.5] * 900, 10, 1000, 100) == pytest.approx(0.425, abs=1e-12)
    # fewer calls than freq_log: one trapezoid from (0,0), then padding:
    # 5 calls of 1.0, budget 100 -> (5*0.5 + 95*1)/100
    assert pmo.auc([1.0] * 5, 10, 100, 100) == pytest.approx(0.975, abs=1e-12)


def test_fewer_than_top_n_calls_use_those_there():
    # 3 calls 0.9, 0.3, 0.6: top-10 mean is their mean 0.6; budget 3, freq 100
    assert pmo.auc([0.9, 0.3, 0.6], 10, 3, 100) == pytest.approx(0.3, abs=1e-12)
    assert pmo.auc([], 10, 100, 100) == 0.0


def test_calls_beyond_budget_ignored():
    # budget 1000: 1 - 100/2000 = 0.95 of the constant; the 1.0s come too late
    assert pmo.auc([0.5] * 1000 + [1.0] * 500, 10, 1000, 100) == \
        pytest.approx(0.95 * 0.5, abs=1e-12)


def test_duplicates_and_invalid_do_not_count():
    recs = [("CCO", 0.2), ("CCO", 0.9), ("", 0.7), ("CCN", None), ("CCC", float("nan")),
            ("c1ccccc1", 0.4)]
    assert pmo.unique_calls(recs) == [0.2, 0.4]
    # so a log whose every second record is a repeat scores as half the calls
    recs = [(str(i // 2), 1.0) for i in range(400)]
    assert pmo.auc(pmo.unique_calls(recs), 10, 400, 100) == pmo.auc([1.0] * 200, 10, 400, 100)
    assert pmo.auc([1.0] * 200, 10, 400, 100) == pytest.approx((50 + 100 + 200) / 400)


def test_matches_the_slow_rule_on_random_logs():
    rng = random.Random(7)
    for _ in range(20):
        n = rng.randrange(0, 2500)
        budget = rng.choice([1000, 2000, 2500])
        scores = [rng.random() ** 3 for _ in range(n)]
        for top_n in (1, 10, 100):
            assert pmo.auc(scores, top_n, budget, 100) == \
                pytest.approx(brute_auc(scores, top_n, budget, 100), abs=1e-12)


def test_read_scored_csv_orders_by_call(tmp_path):
    p = tmp_path / "scored.csv"
    p.write_text("call,step,smiles,canonical,score\n"
                 "2,0,OCC,CCO,0.5\n"
                 "1,0,c1ccccc1,c1ccccc1,0.25\n"
                 "3,1,CC,CC,nan\n")
    assert pmo.read_scored_csv(str(p)) == [0.25, 0.5]


def test_bad_arguments():
    with pytest.raises(ValueError):
        pmo.auc([0.5], 0)
    assert not math.isnan(pmo.auc([0.5], 10, 1, 1))
