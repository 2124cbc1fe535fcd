"""molgen.report: a page rendered from a synthetic `molgen optimize` DIR
(molecules of data/moses_20k.smi with made-up scores) is self-contained, has
the parts asked for, counts scaffolds as RDKit does, and headless Chromium's
screenshot of it is not blank."""
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
