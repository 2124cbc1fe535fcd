"""PMO's metric (Gao et al. 2022, "Sample efficiency matters"; the code
wenhao-gao/mol_opt, main/optimizer.py top_auc): the area under the curve of
the top-n mean score over oracle calls, divided by the budget.

The rule, as mol_opt computes it for AUC top-10 (freq_log 100, budget 10,000):

  * a call is a unique, valid, canonical molecule, in the order first scored;
    invalid molecules and repeats cost nothing and do not count;
  * the first n = min(calls, budget) calls count; top(k) = the mean of the
    best min(top_n, k) scores among the first k calls;
  * the curve starts at (0, 0) and has a point (k, top(k)) at every
    k = freq_log, 2 freq_log, ... strictly below n, then the last point
    (n, top(n)) (a final partial interval when n is not a multiple of
    freq_log); the area is the trapezoid rule over those points;
  * a run that ended before the budget is padded with top(n) from n to the
    budget (mol_opt's finish=True, what its final figures use);
  * AUC = area / budget; 0 for a run with no call.

So a constant score s over the whole budget gives (1 - freq_log / (2 budget)) s
= 0.995 s, not s: the first interval rises from 0. One edge differs from
mol_opt on purpose: its buffer can hold budget + 1 molecules (score_smi adds
one more while len == budget) and its last point then takes the top-n of all
of them; here exactly the first budget calls count.

    /usr/bin/python3 -m molgen.pmo DIR/scored.csv [--budget 10000] [--top 10]
        (prints AUC top-1, top-10, top-100 and the calls counted, as JSON)
"""
import argparse
import csv
import heapq
import json
import math
import sys


class TopMean:
    """The mean of the n largest values pushed so far (a min-heap of them)."""

    def __init__(self, n):
        self.n, self.heap, self.total = n, [], 0.0

    def push(self, x):
        if len(self.heap) < self.n:
            heapq.heappush(self.heap, x)
            self.total += x
        elif x > self.heap[0]:
            self.total += x - heapq.heapreplace(self.heap, x)

    def mean(self):
        return self.total / len(self.heap) if self.heap else 0.0


def curve(scores, top_n=10, budget=10000, freq_log=100):
    """The logged points [(calls k, top-n mean of the first k calls)] of a run
    whose unique valid calls scored `scores` (in call order): k = freq_log,
    2 freq_log, ... below n = min(len(scores), budget), then (n, top(n))."""
    if top_n < 1 or budget < 1 or freq_log < 1:
        raise ValueError("top_n, budget and freq_log must be >= 1")
    n = min(len(scores), budget)
    top, points = TopMean(top_n), []
    for k in range(1, n + 1):
        top.push(float(scores[k - 1]))
        if k % freq_log == 0 and k < n:
            points.append((k, top.mean()))
    if n:
        points.append((n, top.mean()))
    return points


def auc(scores, top_n=10, budget=10000, freq_log=100, finish=True):
    """PMO's AUC top-n of a run: scores of its unique valid calls in call
    order (see the module doc for the rule)."""
    points = curve(scores, top_n, budget, freq_log)
    if not points:
        return 0.0
    area, prev_k, prev_y = 0.0, 0, 0.0
    for k, y in points:
        area += (k - prev_k) * (y + prev_y) / 2.0
        prev_k, prev_y = k, y
    if finish and prev_k < budget:
        area += (budget - prev_k) * prev_y
    return area / budget


def unique_calls(records):
    """[(key, score)] in the order scored -> the scores that count as calls:
    the first occurrence of each key (a canonical SMILES), a record with an
    empty key or a score that is None/NaN (invalid, unscorable) skipped."""
    seen, out = set(), []
    for key, score in records:
        if not key or score is None:
            continue
        score = float(score)
        if math.isnan(score) or key in seen:
            continue
        seen.add(key)
        out.append(score)
    return out


def _float_or_none(text):
    text = (text or "").strip()
    if not text or text.lower() == "nan":
        return None
    return float(text)


def read_scored_csv(path):
    """`molgen optimize`'s DIR/scored.csv -> the scores of its calls in call
    order (rows sorted by the call column; the canonical column is the key,
    the SMILES column when there is none)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    cols = rows[0].keys()
    call_col = next((c for c in ("call", "call_index", "index") if c in cols), None)
    key_col = next((c for c in ("canonical", "smiles", "SMILES") if c in cols), None)
    if key_col is None or "score" not in cols:
        raise ValueError("%s: no canonical/smiles or score column (has %s)"
                         % (path, ", ".join(cols)))
    if call_col is not None:
        rows.sort(key=lambda r: int(r[call_col]))
    return unique_calls((r[key_col], _float_or_none(r["score"])) for r in rows)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m molgen.pmo",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("scored", help="a scored.csv of molgen optimize")
    ap.add_argument("--budget", type=int, default=10000)
    ap.add_argument("--freq-log", type=int, default=100)
    a = ap.parse_args(argv)
    if a.budget < 1 or a.freq_log < 1:
        print("molgen.pmo: --budget and --freq-log must be >= 1", file=sys.stderr)
        return 2
    try:
        scores = read_scored_csv(a.scored)
    except (OSError, ValueError, KeyError) as e:
        print("molgen.pmo: %s" % e, file=sys.stderr)
        return 1
    out = {"calls": min(len(scores), a.budget), "budget": a.budget}
    for n in (1, 10, 100):
        out["auc_top%d" % n] = auc(scores, n, a.budget, a.freq_log)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
