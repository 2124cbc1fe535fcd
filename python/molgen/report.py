"""One self-contained HTML page of a `molgen optimize` run, what a chemist
looks at: the score curve over oracle calls (top-1, top-10, the mean of each
100 calls), PMO's AUC, the best molecules drawn by RDKit with their scores and
components, the scaffold diversity over time (distinct Murcko scaffolds in
each 1,000 calls) and the agent's drift from the prior (mean NLLs).

    /usr/bin/python3 -m molgen.report DIR [--out FILE] [--top 12]

reads DIR/scored.csv (one row per scored molecule: call, step, smiles,
canonical, score, components, prior_nll, agent_nll) and
DIR/summary.json (optional) and writes DIR/report.html (or FILE; never one of
the run's own files, however named). The charts are inline SVG drawn here and
the molecules RDKit's rdMolDraw2D SVG: the page loads nothing (no script, no
font, no image file).

Scores are molgen optimize's: in [0, 1], empty or nan for a molecule not
scored; a score outside [0, 1] (inf, 1e308, -0.5) is refused with the file
and line, as molgen optimize refuses it from a scorer. NLLs must be finite
(any size is drawn); components are "name=value;..." or a JSON object of
name -> number.
"""
import argparse
import csv
import html
import io
import json
import math
import os
import sys

from molgen import pmo
from molgen.atomic import atomic_open

SERIES = (("top-1", "#d62728"), ("top-10", "#1f77b4"), ("mean of 100 calls", "#7f7f7f"))
KNOWN = {"call", "call_index", "index", "step", "smiles", "canonical", "score", "components",
         "prior_nll", "agent_nll", "scaffold", "source"}


# the run's files in DIR (molgen optimize's), none of which --out may be
RUN_FILES = ("scored.csv", "summary.json", "best.smi", "agent.safetensors")


def _num(text):
    text = (text or "").strip()
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return None if math.isnan(v) else v


def _components(text, where):
    """'name=value;name=value' (or a JSON object of name -> number) ->
    {name: value}; where ('FILE:LINE') names a cell that is neither."""
    text = (text or "").strip()
    if not text:
        return {}
    if text[0] in "{[":
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in obj.values()):
            raise ValueError("%s: the components cell %r is not a JSON object of name -> number "
                             "(or name=value;name=value)" % (where, text[:80]))
        return {str(k): float(v) for k, v in obj.items()}
    out = {}
    for part in text.split(";"):
        name, eq, value = part.partition("=")
        if eq and _num(value) is not None:
            out[name.strip()] = _num(value)
    return out


def _score(text, where):
    """a score cell -> None (empty, nan: not scored) or its value in [0, 1]"""
    v = _num(text)
    if v is not None and not 0.0 <= v <= 1.0:
        raise ValueError("%s: score %r is outside [0, 1] (molgen optimize's scores are in "
                         "[0, 1]; nan or empty: not scored)" % (where, text.strip()))
    return v


def _nll(text, where, name):
    """an NLL cell -> None (empty, nan) or its finite value"""
    v = _num(text)
    if v is not None and not math.isfinite(v):
        raise ValueError("%s: %s %r is not a finite number" % (where, name, text.strip()))
    return v


def _text(path):
    """a file's text; not UTF-8: a ValueError naming the file, line and byte"""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError("%s:%d: not UTF-8 text (byte 0x%02x at offset %d)"
                         % (path, line, data[e.start], e.start)) from None


def read_run(directory):
    """-> (rows in call order, summary dict). A row: call, step, smiles, key
    (canonical SMILES), score (None: not scored), comps {name: value},
    prior_nll, agent_nll; scaffold None (render fills it in)."""
    path = os.path.join(directory, "scored.csv")
    # any run molgen can write: fields are bounded at the scorer protocol
    # (1 KiB), but older runs held longer ones than csv's 128 KiB default
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))
    with io.StringIO(_text(path), newline="") as f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        call_col = next((c for c in ("call", "call_index", "index") if c in cols), None)
        if call_col is None or "smiles" not in cols or "score" not in cols:
            raise ValueError("%s: needs the columns call, smiles and score (has %s)"
                             % (path, ", ".join(cols) or "none"))
        extra = [c for c in cols if c not in KNOWN]
        rows = []
        rd = iter(reader)
        while True:
            try:
                r = next(rd, None)
            except csv.Error as e:  # a NUL byte, an unclosed quote
                raise ValueError("%s:%d: %s" % (path, reader.line_num, e)) from None
            if r is None:
                break
            where = "%s:%d" % (path, reader.line_num)  # the record's last line
            try:
                call = int(r[call_col])
            except (TypeError, ValueError):
                raise ValueError("%s: call %r is not an integer" % (where, r[call_col]))
            comps = _components(r.get("components"), where)
            for c in extra:
                if _num(r.get(c)) is not None:
                    comps[c] = _num(r[c])
            rows.append({"call": call, "step": r.get("step", ""), "smiles": r["smiles"],
                         "key": r.get("canonical") or r["smiles"],
                         "score": _score(r["score"], where), "comps": comps,
                         "prior_nll": _nll(r.get("prior_nll"), where, "prior_nll"),
                         "agent_nll": _nll(r.get("agent_nll"), where, "agent_nll"),
                         "source": r.get("source") or None, "scaffold": None})
    rows.sort(key=lambda r: r["call"])
    summary = {}
    spath = os.path.join(directory, "summary.json")
    if os.path.exists(spath):
        try:
            summary = json.loads(_text(spath))
        except json.JSONDecodeError as e:
            raise ValueError("%s:%d: not JSON (%s)" % (spath, e.lineno, e.msg)) from None
        if not isinstance(summary, dict):
            raise ValueError("%s: not a JSON object" % spath)
    return rows, summary


def calls(rows):
    """The rows that count as oracle calls (pmo.unique_calls's rule)."""
    seen, out = set(), []
    for r in rows:
        if r["key"] and r["score"] is not None and r["key"] not in seen:
            seen.add(r["key"])
            out.append(r)
    return out


def _scaffold(smiles):
    from rdkit import Chem
    from molgen.props import murcko_scaffold
    mol = Chem.MolFromSmiles(smiles)
    return None if mol is None else murcko_scaffold(mol)


# ---------------------------------------------------------------- SVG charts

def _ticks(hi, n=5):
    """About n round tick values from 0 to >= hi (any finite hi: past the
    largest float the last tick is hi itself)."""
    if not hi > 0:
        return [0, 1]
    raw = hi / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    out, v = [], 0.0
    while v < hi - 1e-9 * step:
        out.append(v)
        v += step
    out.append(v if math.isfinite(v) else hi)
    return out


def _fmt(v):
    return ("%d" % v) if float(v).is_integer() and abs(v) < 1e15 else ("%.6g" % v)


class Chart:
    """A line/bar chart in an SVG of w x h pixels, data x in [0, xmax],
    y in [ymin, ymax]."""

    def __init__(self, w, h, xmax, ymin, ymax, xlabel, ylabel, yticks=None):
        self.w, self.h = w, h
        self.l, self.r, self.t, self.b = 62, 16, 14, 46
        self.xt = _ticks(xmax)
        self.xmax = self.xt[-1]
        if not yticks and not math.isfinite(ymax - ymin):  # e.g. -1e308 to 1e308
            yticks = [ymin, ymin / 2 + ymax / 2, ymax]
        self.yt = yticks or [ymin + v for v in _ticks(ymax - ymin)]
        self.ymin, self.ymax = ymin, self.yt[-1]
        self.parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
                      'viewBox="0 0 %d %d" class="chart">' % (w, h, w, h),
                      '<rect width="%d" height="%d" fill="#fff"/>' % (w, h)]
        for v in self.yt:
            y = self.y(v)
            self.parts.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e3e3e3"/>'
                              % (self.l, w - self.r, y, y))
            self.parts.append('<text x="%d" y="%.1f" text-anchor="end" font-size="12" '
                              'fill="#444">%s</text>' % (self.l - 6, y + 4, _fmt(round(v, 6))))
        for v in self.xt:
            x = self.x(v)
            self.parts.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#888"/>'
                              % (x, x, h - self.b, h - self.b + 5))
            self.parts.append('<text x="%.1f" y="%d" text-anchor="middle" font-size="12" '
                              'fill="#444">%s</text>' % (x, h - self.b + 19, _fmt(v)))
        self.parts.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#888"/>'
                          % (self.l, w - self.r, h - self.b, h - self.b))
        self.parts.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#888"/>'
                          % (self.l, self.l, self.t, h - self.b))
        self.parts.append('<text x="%.1f" y="%d" text-anchor="middle" font-size="13" '
                          'fill="#222">%s</text>' % ((self.l + w - self.r) / 2, h - 8,
                                                     html.escape(xlabel)))
        self.parts.append('<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle" '
                          'font-size="13" fill="#222">%s</text>' % ((self.t + h - self.b) / 2,
                                                                     html.escape(ylabel)))

    def x(self, v):
        return self.l + (self.w - self.l - self.r) * v / (self.xmax or 1)

    def y(self, v):
        # halves first: ymax - ymin and v - ymin stay finite for any finite
        # values (1e308 - -1e308 would not)
        span = (self.ymax / 2 - self.ymin / 2) or 1
        return self.h - self.b - (self.h - self.t - self.b) * ((v / 2 - self.ymin / 2) / span)

    def line(self, pts, color, width=2):
        if pts:
            d = " ".join("%.1f,%.1f" % (self.x(a), self.y(b)) for a, b in pts)
            self.parts.append('<polyline fill="none" stroke="%s" stroke-width="%g" '
                              'stroke-linejoin="round" points="%s"/>' % (color, width, d))

    def bars(self, spans, color):
        """spans [(x0, x1, value)]: a bar over [x0, x1] with its value on top."""
        for x0, x1, v in spans:
            a, b = self.x(x0) + 2, self.x(x1) - 2
            y = self.y(v)
            self.parts.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>'
                              % (a, y, max(b - a, 1), self.y(self.ymin) - y, color))
            self.parts.append('<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11" '
                              'fill="#222">%d</text>' % ((a + b) / 2, y - 4, v))

    def legend(self, items):
        x = self.l + 12
        for name, color in items:
            self.parts.append('<rect x="%d" y="%d" width="14" height="4" fill="%s"/>'
                              % (x, self.t + 8, color))
            self.parts.append('<text x="%d" y="%d" font-size="12" fill="#222">%s</text>'
                              % (x + 19, self.t + 13, html.escape(name)))
            x += 26 + 7 * len(name)

    def svg(self):
        return "\n".join(self.parts + ["</svg>"])


def score_curves(call_rows, window=100):
    """-> {series name: [(calls, value)]}: running top-1 and top-10 after each
    call (thinned to about 600 points), the mean score of each window calls."""
    n = len(call_rows)
    every = max(1, n // 600)
    top1, top10 = pmo.TopMean(1), pmo.TopMean(10)
    out = {name: [(0, 0.0)] if name != SERIES[2][0] else [] for name, _ in SERIES}
    acc = 0.0
    for k, r in enumerate(call_rows, 1):
        top1.push(r["score"])
        top10.push(r["score"])
        acc += r["score"]
        if k % every == 0 or k == n:
            out["top-1"].append((k, top1.mean()))
            out["top-10"].append((k, top10.mean()))
        if k % window == 0 or k == n:
            size = k - (k - 1) // window * window
            out[SERIES[2][0]].append((k, acc / size))
            acc = 0.0
    return out


def score_chart(call_rows):
    ch = Chart(1000, 300, max(len(call_rows), 1), 0.0, 1.0, "oracle calls (unique valid molecules)",
               "score", [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    curves = score_curves(call_rows)
    for name, color in SERIES:
        ch.line(curves[name], color, 1.5 if name.startswith("mean") else 2.2)
    ch.legend(SERIES)
    return ch.svg()


def scaffold_windows(call_rows, window=1000):
    """-> [(first call - 1, last call, distinct scaffolds, molecules)] per window
    calls (the last window possibly partial); a molecule without a ring has
    the empty scaffold, counted as one."""
    out = []
    for a in range(0, len(call_rows), window):
        chunk = call_rows[a:a + window]
        scafs = {r["scaffold"] for r in chunk if r["scaffold"] is not None}
        out.append((a, a + len(chunk), len(scafs), len(chunk)))
    return out


def scaffold_chart(wins, window):
    top = max([w[2] for w in wins] + [1])
    ch = Chart(1000, 200, max(wins[-1][1], 1) if wins else 1, 0, top,
               "oracle calls (windows of %d)" % window, "distinct scaffolds")
    ch.bars([(a, b, s) for a, b, s, _ in wins], "#2ca02c")
    return ch.svg()


def nll_chart(call_rows, window=100):
    pts = {"prior NLL": [], "agent NLL": []}
    for a in range(0, len(call_rows), window):
        chunk = call_rows[a:a + window]
        for key, name in (("prior_nll", "prior NLL"), ("agent_nll", "agent NLL")):
            vals = [r[key] for r in chunk if r[key] is not None]
            if vals:  # the mean of each v / n: finite for any finite NLLs
                pts[name].append((a + len(chunk), math.fsum(v / len(vals) for v in vals)))
    if not pts["prior NLL"] and not pts["agent NLL"]:
        return None
    hi = max([0.0] + [v for p in pts.values() for _, v in p])
    lo = min([0.0] + [v for p in pts.values() for _, v in p])
    ch = Chart(1000, 260, len(call_rows), lo, hi, "oracle calls",
               "mean NLL of %d calls (nats)" % window)
    colors = (("prior NLL", "#9467bd"), ("agent NLL", "#ff7f0e"))
    for name, color in colors:
        ch.line(pts[name], color)
    ch.legend(colors)
    return ch.svg()


# ---------------------------------------------------------------- molecules

def draw(smiles, w=250, h=190):
    """RDKit's 2D drawing of a molecule as an inline SVG element ('' if RDKit
    cannot parse it)."""
    from rdkit import Chem
    from rdkit.Chem.Draw import rdMolDraw2D
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return ""
    d = rdMolDraw2D.MolDraw2DSVG(w, h)
    rdMolDraw2D.PrepareAndDrawMolecule(d, mol)
    d.FinishDrawing()
    svg = d.GetDrawingText()
    return svg[svg.index("<svg"):]


def best(call_rows, k):
    """The k best calls (by score, then the earliest)."""
    return sorted(call_rows, key=lambda r: (-r["score"], r["call"]))[:k]


SOURCES = {"agent": "sampled by the agent", "ga": "a child of the GA (--ga-offspring)"}


def source_table(crow):
    """Where the run's calls came from (scored.csv's source column: the
    agent's samples or the GA's children): calls, mean score, best score and
    how many of the 10 and 100 best; None when the run has no such column."""
    if not any(r.get("source") for r in crow):
        return None
    ranked = sorted(crow, key=lambda r: -r["score"])
    top10 = {id(r) for r in ranked[:10]}
    top100 = {id(r) for r in ranked[:100]}
    body = []
    for src in sorted({r.get("source") or "?" for r in crow}):
        rs = [r for r in crow if (r.get("source") or "?") == src]
        body.append("<tr><td>%s</td><td>%d (%.1f %%)</td><td>%.3f</td><td>%.3f</td><td>%d</td>"
                    "<td>%d</td></tr>"
                    % (html.escape(SOURCES.get(src, src)), len(rs), 100.0 * len(rs) / len(crow),
                       sum(r["score"] for r in rs) / len(rs), max(r["score"] for r in rs),
                       sum(id(r) in top10 for r in rs), sum(id(r) in top100 for r in rs)))
    return ("<table class=\"kv\"><tr><td><b>source</b></td><td><b>calls</b></td><td><b>mean "
            "score</b></td><td><b>best</b></td><td><b>in the top 10</b></td><td><b>in the top "
            "100</b></td></tr>%s</table>" % "".join(body))


def molecule_cards(rows):
    cards = []
    for rank, r in enumerate(rows, 1):
        comps = "".join("<tr><td>%s</td><td>%.4g</td></tr>" % (html.escape(k), v)
                        for k, v in sorted(r["comps"].items()))
        nll = ""
        if r["prior_nll"] is not None:
            nll = " &middot; prior NLL %s" % (("%.1f" if abs(r["prior_nll"]) < 1e6 else "%.4g")
                                              % r["prior_nll"])
        cards.append(
            '<div class="card"><div class="rank">#%d &nbsp; score <b>%.4f</b></div>%s'
            '<div class="smi">%s</div><div class="meta">call %d &middot; step %s%s%s</div>'
            '<table class="comps">%s</table></div>'
            % (rank, r["score"], draw(r["smiles"]), html.escape(r["smiles"]), r["call"],
               html.escape(str(r["step"])), nll,
               " &middot; from the GA" if r.get("source") == "ga" else "", comps))
    return "\n".join(cards)


# ---------------------------------------------------------------- page

CSS = """
body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:22px;margin:0 0 6px} h2{font-size:17px;margin:26px 0 8px}
.sub{color:#555;font-size:13px}
table.kv{border-collapse:collapse;font-size:13px} table.kv td{padding:2px 12px 2px 0}
table.kv td:first-child{color:#555}
.grid{display:flex;flex-wrap:wrap;gap:12px}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px;width:252px;font-size:12px}
.card svg{display:block}
.rank{font-size:13px;margin-bottom:4px}
.smi{font-family:DejaVu Sans Mono,monospace;word-break:break-all;color:#333;margin:4px 0}
.meta{color:#666} table.comps{font-size:11px;margin-top:4px} table.comps td{padding:0 8px 0 0}
.chart{background:#fff;border:1px solid #ddd}
"""


def _summary_rows(summary, n_calls, aucs):
    keep = []
    for k, v in summary.items():
        if isinstance(v, dict):  # e.g. the options: one line of name=value
            v = ", ".join("%s=%s" % (a, b) for a, b in v.items()
                          if isinstance(b, (str, int, float, bool)))
        if isinstance(v, (str, int, float, bool)) and len(str(v)) < 400:
            keep.append((k, v))
    keep.append(("calls counted (unique valid)", n_calls))
    for k, v in aucs.items():
        keep.append((k, "%.4f" % v))
    return "".join("<tr><td>%s</td><td>%s</td></tr>" % (html.escape(str(k)), html.escape(str(v)))
                   for k, v in keep)


def render(directory, top=12, window=1000):
    """The page's HTML for the run in directory."""
    rows, summary = read_run(directory)
    crow = calls(rows)
    for r in crow:  # RDKit's Murcko scaffold, whatever the scorer sent
        r["scaffold"] = _scaffold(r["smiles"])
    budget = summary.get("budget")  # molgen's range: an integer in [1, 1e12]
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= 10 ** 12:
        budget = None
    budget = budget or max(len(crow), 1)
    scores = [r["score"] for r in crow]
    aucs = {"PMO AUC top-%d (budget %d)" % (n, budget): pmo.auc(scores, n, budget)
            for n in (1, 10, 100)}
    wins = scaffold_windows(crow, window)
    nll = nll_chart(crow)
    where = os.path.abspath(directory).split(os.sep)
    title = "molgen optimize: %s" % (summary.get("task") or "/".join(where[-2:]))
    parts = [
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>%s</title>"
        "<style>%s</style></head><body>" % (html.escape(title), CSS),
        "<h1>%s</h1><div class=\"sub\">%s &middot; %d rows in scored.csv, %d oracle calls</div>"
        % (html.escape(title), html.escape(os.path.abspath(directory)), len(rows), len(crow)),
        "<h2>Run</h2><table class=\"kv\">%s</table>" % _summary_rows(summary, len(crow), aucs),
        "<h2>Score over oracle calls</h2>", score_chart(crow),
        "<h2>Scaffold diversity</h2><div class=\"sub\">distinct Murcko scaffolds among each "
        "%d calls</div>" % window,
        scaffold_chart(wins, window) if wins else "<p>no calls</p>",
        "<h2>Best molecules</h2><div class=\"grid\">%s</div>" % molecule_cards(best(crow, top)),
    ]
    src = source_table(crow)
    if src:
        parts += ["<h2>Where the molecules came from</h2>", src]
    if nll:
        parts += ["<h2>Likelihood under the prior and the agent</h2>", nll]
    parts.append("</body></html>")
    return "\n".join(parts)


def check_out(directory, out):
    """Refuses (ValueError) an out that is one of the run's files in
    directory by another name: the same file (st_dev, st_ino) through a
    symbolic link, a hard link, '..' or a linked directory."""
    try:
        st = os.stat(out)
    except OSError:
        return  # nothing there yet (or a dangling link): a new file
    if os.path.isdir(out):
        raise ValueError("--out %s is a directory: give the page's file name" % out)
    for name in RUN_FILES:
        path = os.path.join(directory, name)
        try:
            run = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (run.st_dev, run.st_ino):
            raise ValueError("--out %s is the run's %s: give the page another name (default "
                             "%s)" % (out, path, os.path.join(directory, "report.html")))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m molgen.report",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="a molgen optimize --out directory")
    ap.add_argument("--out", help="the page (default DIR/report.html)")
    ap.add_argument("--top", type=int, default=12, help="molecules drawn (default 12)")
    ap.add_argument("--window", type=int, default=1000,
                    help="calls per scaffold-diversity bar (default 1000)")
    a = ap.parse_args(argv)
    if a.top < 0 or a.window < 1:
        print("molgen.report: --top must be >= 0 and --window >= 1", file=sys.stderr)
        return 2
    out = a.out or os.path.join(a.dir, "report.html")
    try:
        check_out(a.dir, out)
        page = render(a.dir, a.top, a.window)
        with atomic_open(out) as f:  # a new temporary beside out, never followed
            f.write(page)
    except (OSError, ValueError, KeyError) as e:
        print("molgen.report: %s" % e, file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
