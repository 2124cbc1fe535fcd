"""molgen.report: a page rendered from a synthetic `molgen optimize` DIR
(molecules of data/moses_20k.smi with made-up scores) is self-contained, has
the parts asked for, counts scaffolds as RDKit does, and headless Chromium's
screenshot of it is not blank."""
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import zlib

import pytest

pytest.importorskip("rdkit")
from rdkit import Chem  # noqa: E402
from rdkit.Chem.Scaffolds import MurckoScaffold  # noqa: E402

from molgen import pmo, report  # noqa: E402
from molgen_bin import first_molecules  # noqa: E402

N = 2500


def make_run(d):
    """DIR with scored.csv (N calls, 5 repeats and 2 unscored rows mixed in)
    and summary.json; -> (the call rows' scores, their SMILES) in call order."""
    rng = random.Random(3)
    mols = first_molecules(N)
    lines = ["call,step,smiles,canonical,score,components,prior_nll,agent_nll"]
    scores, smiles, call = [], [], 0
    for i, s in enumerate(mols):
        sc = min(1.0, 0.2 + 0.6 * i / N + 0.2 * rng.random())
        call += 1
        lines.append("%d,%d,%s,%s,%.6f,qed=%.4f;sim=%.4f,%.3f,%.3f"
                     % (call, i // 64, s, Chem.CanonSmiles(s), sc, sc * 0.9, sc ** 2,
                        30 + 5 * rng.random(), 30 - 10 * i / N + rng.random()))
        scores.append(sc)
        smiles.append(s)
        if i % 500 == 7:  # a repeat (ignored) and an unscored molecule
            call += 1
            lines.append("%d,%d,%s,%s,0.99,,1,1" % (call, i // 64, s, Chem.CanonSmiles(s)))
            call += 1
            lines.append("%d,%d,C1CC,,nan,,," % (call, i // 64))
    (d / "scored.csv").write_text("\n".join(lines) + "\n")
    (d / "summary.json").write_text('{"task": "synthetic", "budget": %d, "seed": 1}' % N)
    return scores, smiles


def png_pixels(path):
    """A PNG (8-bit RGB/RGBA, not interlaced: what Chromium writes) ->
    (width, height, rows of (r, g, b) tuples)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev, rows, at = bytearray(stride), [], 0
    for _ in range(h):
        f, line = raw[at], bytearray(raw[at + 1:at + 1 + stride])
        at += 1 + stride
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, bpp)])
        prev = line
    return w, h, rows


def test_page_parts_and_numbers(tmp_path):
    scores, smiles = make_run(tmp_path)
    rc = subprocess.run([sys.executable, "-m", "molgen.report", str(tmp_path), "--top", "9"],
                        capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0, rc.stderr
    page = (tmp_path / "report.html").read_text()
    # self-contained: no script, no link, no fetched resource
    for bad in ("<script", "<link", "src=", "href=", "@import", "url("):
        assert bad not in page.lower(), bad
    assert page.count('class="card"') == 9
    assert page.count("<svg") == 9 + 3  # 9 molecules, score, scaffold and NLL charts
    # the best molecule (independently: the max of the made-up scores) comes first
    top = max(range(N), key=lambda i: (scores[i], -i))
    first = page.index('class="card"')
    assert ("score <b>%.4f</b>" % scores[top]) in page[first:first + 400]
    assert smiles[top] in page[first:page.index('class="card"', first + 1)]
    assert "calls counted (unique valid)</td><td>%d<" % N in page
    assert "PMO AUC top-10 (budget %d)</td><td>%.4f<" % (N, pmo.auc(scores, 10, N)) in page
    # scaffold bars: distinct Murcko scaffolds in calls 1-1000, 1001-2000, 2001-2500
    for a, b in ((0, 1000), (1000, 2000), (2000, N)):
        k = len({MurckoScaffold.MurckoScaffoldSmiles(mol=Chem.MolFromSmiles(s))
                 for s in smiles[a:b]})
        assert ('fill="#222">%d</text>' % k) in page, (a, b, k)


def test_bad_directory_is_one_line(tmp_path):
    rc = subprocess.run([sys.executable, "-m", "molgen.report", str(tmp_path / "none")],
                        capture_output=True, text=True, timeout=60)
    assert rc.returncode == 1
    assert rc.stderr.startswith("molgen.report: ") and rc.stderr.count("\n") == 1
    (tmp_path / "scored.csv").write_text("step,smiles\n0,CCO\n")
    rc = subprocess.run([sys.executable, "-m", "molgen.report", str(tmp_path)],
                        capture_output=True, text=True, timeout=60)
    assert rc.returncode == 1 and "needs the columns call, smiles and score" in rc.stderr


def test_long_field_is_read(tmp_path):
    """a scored.csv field past csv's 131072-byte default (a run of an older
    molgen held a 900,000-byte scaffold): was "field larger than field limit" """
    (tmp_path / "scored.csv").write_text(
        "call,step,smiles,canonical,score,prior_nll,agent_nll,scaffold,components\n"
        "1,0,CCO,CCO,0.5,20.0,20.0,%s,\n2,0,CCN,CCN,0.7,21.0,21.0,,\n" % ("C" * 900000))
    rc = subprocess.run([sys.executable, "-m", "molgen.report", str(tmp_path)],
                        capture_output=True, text=True, timeout=120)
    assert rc.returncode == 0, rc.stderr
    assert (tmp_path / "report.html").exists()


def test_screenshot_not_blank(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if not browser:
        pytest.skip("chromium is not installed (Debian package chromium, tools/debian-packages.txt)")
    make_run(tmp_path)
    assert report.main([str(tmp_path)]) == 0
    png = tmp_path / "report.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--user-data-dir=%s" % (tmp_path / "profile"), "--screenshot=%s" % png,
           "--window-size=1200,1600", "file://%s" % (tmp_path / "report.html")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0 and png.exists(), p.stderr[-2000:]
    if os.environ.get("MOLGEN_REPORT_PNG"):  # keep it to look at
        shutil.copy(str(png), os.environ["MOLGEN_REPORT_PNG"])
    w, h, rows = png_pixels(str(png))
    assert (w, h) == (1200, 1600)
    pix = [p for r in rows[::4] for p in r[::4]]
    lum = [0.299 * r + 0.587 * g + 0.114 * b for r, g, b in pix]
    mean = sum(lum) / len(lum)
    var = sum((v - mean) ** 2 for v in lum) / len(lum)
    assert var > 100, var
    assert len(set(pix)) >= 20
    # the curves' colours are drawn: red top-1, blue top-10, green scaffold bars
    near = lambda c, t: all(abs(x - y) < 40 for x, y in zip(c, t))  # noqa: E731
    for rgb in ((0xd6, 0x27, 0x28), (0x1f, 0x77, 0xb4), (0x2c, 0xa0, 0x2c)):
        assert sum(near(p, rgb) for p in pix) > 20, rgb


# ---------------------------------------------------------------- hostile runs

HEAD = "call,step,smiles,canonical,score,prior_nll,agent_nll,scaffold,components\n"


def run_report(d, *args):
    return subprocess.run([sys.executable, "-m", "molgen.report", str(d)] + list(args),
                          capture_output=True, text=True, timeout=120)


def one_line_error(rc, *words):
    assert rc.returncode == 1, rc.stderr
    assert rc.stderr.startswith("molgen.report: ") and rc.stderr.count("\n") == 1, rc.stderr
    assert "Traceback" not in rc.stderr
    for w in words:
        assert w in rc.stderr, (w, rc.stderr)


@pytest.mark.parametrize("how", ["same", "dotdot", "symlink", "hardlink", "dirlink", "summary"])
def test_out_that_is_a_run_file_is_refused(tmp_path, how):
    """was: `--out DIR/scored.csv` replaced the run's scored.csv with HTML"""
    d = tmp_path / "run"
    d.mkdir()
    (d / "scored.csv").write_text(HEAD + "1,0,CCO,CCO,0.5,20,20,,\n")
    (d / "summary.json").write_text('{"budget": 10}')
    target = d / ("summary.json" if how == "summary" else "scored.csv")
    out = {"same": target, "summary": target, "dotdot": d / "x" / ".." / "scored.csv",
           "symlink": tmp_path / "link.html", "hardlink": tmp_path / "hard.html",
           "dirlink": tmp_path / "dl" / "scored.csv"}[how]
    if how == "dotdot":
        (d / "x").mkdir()
    elif how == "symlink":
        os.symlink(str(target), str(out))
    elif how == "hardlink":
        os.link(str(target), str(out))
    elif how == "dirlink":
        os.symlink(str(d), str(tmp_path / "dl"))
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    one_line_error(run_report(d, "--out", str(out)), "--out %s is the run's " % out,
                   str(target.name), "another name")
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    assert not (d / "report.html").exists()
    one_line_error(run_report(d, "--out", str(d)), "is a directory")
    assert run_report(d, "--out", str(tmp_path / "page.html")).returncode == 0


@pytest.mark.parametrize("score", ["inf", "-inf", "1e308", "1.5", "-0.25", "1e-400x"])
def test_score_outside_unit_range_is_refused_with_file_and_line(tmp_path, score):
    """was: inf or 1e308 gave '-inf' SVG coordinates and AUC inf (a score
    that is not a number, 1e-400x, stays 'not scored', as before)"""
    p = tmp_path / "scored.csv"
    # a quoted field over two lines before: the line named is the file's
    p.write_text(HEAD + '1,0,CCO,CCO,0.5,20,20,,"a=1;\nb=2"\n2,0,CCN,CCN,%s,21,21,,\n' % score)
    rc = run_report(tmp_path)
    if score == "1e-400x":
        assert rc.returncode == 0, rc.stderr
        return
    one_line_error(rc, "%s:4: score '%s' is outside [0, 1]" % (p, score))


def svg_numbers(page):
    """every coordinate, size and polyline point of the page's charts"""
    import re
    vals = []
    for name, v in re.findall(r'\b(x|y|x1|x2|y1|y2|width|height|points)="([^"]*)"', page):
        vals += [t for t in re.split(r"[ ,]+", v.strip()) if t]
    return vals


@pytest.mark.parametrize("nlls", [("1e308", "1.7e308"), ("-1e308", "1.79e308"), ("0", "1e300")])
def test_huge_finite_nlls_are_drawn_with_finite_coordinates(tmp_path, nlls):
    """NLLs of any finite size: the mean of each window and the axis stay
    finite (was: sum overflowed to inf); inf itself is refused by name"""
    rows = "".join("%d,0,%s,%s,%.2f,%s,%s,,\n" % (i + 1, s, s, 0.1 * (i + 1), nlls[i % 2],
                                                   nlls[(i + 1) % 2])
                   for i, s in enumerate(["CCO", "CCN", "CCC", "CCCl"]))
    (tmp_path / "scored.csv").write_text(HEAD + rows)
    rc = run_report(tmp_path)
    assert rc.returncode == 0, rc.stderr
    page = (tmp_path / "report.html").read_text()
    assert page.count("<svg") == 4 + 3  # the NLL chart is drawn
    vals = svg_numbers(page)
    assert len(vals) > 50
    for v in vals:
        assert math.isfinite(float(v)), v
    # AUC top-1 over budget 4 (no summary), by hand: with a point every 100
    # calls the curve is one trapezoid from (0, 0) to (4, top-1 0.4): 0.8 / 4
    assert "PMO AUC top-1 (budget 4)</td><td>0.2000<" in page
    (tmp_path / "scored.csv").write_text(HEAD + "1,0,CCO,CCO,0.5,20,inf,,\n")
    one_line_error(run_report(tmp_path), "scored.csv:2: agent_nll 'inf' is not a finite number")


@pytest.mark.parametrize("cell", ['"{""qed"": [1, 2]}"', '"[0.5, 0.7]"', '"{""qed"": null}"',
                                  '"{""qed"": {""x"": 1}}"', '"{""qed"": 0.5"'])
def test_components_json_that_is_not_name_to_number_is_one_line(tmp_path, cell):
    """was: a JSON list in a components cell: a TypeError traceback"""
    p = tmp_path / "scored.csv"
    p.write_text(HEAD + "1,0,CCO,CCO,0.5,20,20,,qed=0.4\n2,0,CCN,CCN,0.6,20,20,,%s\n" % cell)
    one_line_error(run_report(tmp_path), "%s:3: the components cell" % p,
                   "not a JSON object of name -> number")
    p.write_text(HEAD + '1,0,CCO,CCO,0.5,20,20,,"{""qed"": 0.25, ""sim"": 1}"\n')
    rc = run_report(tmp_path)
    assert rc.returncode == 0, rc.stderr
    page = (tmp_path / "report.html").read_text()
    assert "<td>qed</td><td>0.25</td>" in page and "<td>sim</td><td>1</td>" in page


def test_not_utf8_names_the_file_and_line(tmp_path):
    """was: "'utf-8' codec can't decode byte 0xff ...", no file named"""
    p = tmp_path / "scored.csv"
    p.write_bytes(HEAD.encode() + b"1,0,CCO,CCO,0.5,20,20,,\n2,0,C\xffN,CCN,0.5,20,20,,\n")
    one_line_error(run_report(tmp_path), "%s:3: not UTF-8 text (byte 0xff" % p)
    p.write_bytes(HEAD.encode() + b"1,0,CCO,CCO,0.5,20,20,,\n")
    (tmp_path / "summary.json").write_bytes(b'{"task": "\xfe"}')
    one_line_error(run_report(tmp_path), "%s:1: not UTF-8 text (byte 0xfe"
                   % (tmp_path / "summary.json"))
    (tmp_path / "summary.json").write_text('{"task": ')
    one_line_error(run_report(tmp_path), "%s:1: not JSON" % (tmp_path / "summary.json"))


def test_sources_are_counted(tmp_path):
    """scored.csv's source column (agent / ga): the table's counts, mean and
    best scores and top-10 membership against the same figures computed
    here; the GA's cards say so."""
    rng = random.Random(5)
    mols = first_molecules(300)
    lines = ["call,step,smiles,canonical,score,prior_nll,agent_nll,scaffold,components,source"]
    rows = []
    for i, s in enumerate(mols):
        src = "ga" if i % 4 == 3 else "agent"
        sc = round(rng.random() * (1.0 if src == "ga" else 0.6), 6)
        rows.append((sc, src))
        lines.append("%d,%d,%s,%s,%.6f,30,30,,,%s" % (i + 1, i // 20, s, Chem.CanonSmiles(s), sc,
                                                      src))
    (tmp_path / "scored.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "summary.json").write_text('{"budget": 300}')
    page = report.render(str(tmp_path))
    top10 = sorted(rows, key=lambda r: -r[0])[:10]
    for src, label in (("agent", "sampled by the agent"), ("ga", "a child of the GA")):
        sc = [r[0] for r in rows if r[1] == src]
        cell = "<tr><td>%s" % label
        assert cell in page, label
        row = page[page.index(cell):page.index("</tr>", page.index(cell))]
        assert "<td>%d (%.1f %%)</td><td>%.3f</td><td>%.3f</td><td>%d</td>" % (
            len(sc), 100.0 * len(sc) / 300, sum(sc) / len(sc), max(sc),
            sum(r[1] == src for r in top10)) in row, row
    top12 = sorted(range(300), key=lambda i: (-rows[i][0], i))[:12]  # the 12 cards
    assert page.count("from the GA") == sum(rows[i][1] == "ga" for i in top12) > 0
