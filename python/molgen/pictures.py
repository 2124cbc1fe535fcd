"""Histograms of conditionally generated molecules' properties over the data's, as SVG.

Usage:
    /usr/bin/python3 -m molgen.pictures --data PROPS.csv --out plot.svg \\
        logp=1.18:samples_a.smi logp=3.52:samples_b.smi qed=0.82:samples_c.smi ...

One panel per property named in the arguments: the data's histogram (the
CSV that molgen.props wrote, grey, as a density) and, for each NAME=TARGET:FILE,
the histogram of the property over FILE's valid samples (computed with
molgen.props's functions), in its own colour with a dashed line at the target.
"""

import argparse
import csv
import math
import os
import sys

from molgen.atomic import atomic_open

COLOURS = ('#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b')
UNITS = {'logp': 'Crippen logP', 'qed': 'QED', 'sas': 'SA score', 'tpsa': 'TPSA (A^2)',
         'mw': 'molecular weight'}


def _props():
    from molgen import props
    return props


def sample_values(path, name):
    from rdkit import Chem, RDLogger
    RDLogger.DisableLog('rdApp.*')
    props = _props()
    out = []
    with open(path) as f:
        for line in f:
            s = line.strip()
            m = Chem.MolFromSmiles(s) if s else None
            if m is not None and m.GetNumAtoms() > 0:
                out.append(props.properties(m)[name])
    return out


def histogram(values, lo, hi, bins):
    """Densities of values over bins equal bins of [lo, hi] (outside: clipped)."""
    counts = [0] * bins
    w = (hi - lo) / bins
    for v in values:
        counts[min(bins - 1, max(0, int((v - lo) / w)))] += 1
    n = max(1, len(values))
    return [c / (n * w) for c in counts]


def panel(name, data, series, x0, y0, W, H, bins=40):
    lo = min(data)
    hi = max(data)
    q = sorted(data)
    lo, hi = q[int(0.002 * (len(q) - 1))], q[int(0.998 * (len(q) - 1))]
    dens = [histogram(data, lo, hi, bins)] + [histogram(v, lo, hi, bins) for _, _, v in series]
    top = max(max(d) for d in dens) * 1.05
    px = lambda v: x0 + (v - lo) / (hi - lo) * W  # noqa: E731
    py = lambda d: y0 + H - d / top * H  # noqa: E731
    bw = W / bins
    out = ['<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>'
           % (x0, y0, W, H)]
    for i, d in enumerate(dens[0]):
        out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#bbb"/>'
                   % (x0 + i * bw, py(d), bw, y0 + H - py(d)))
    for j, (target, label, vals) in enumerate(series):
        c = COLOURS[j % len(COLOURS)]
        pts = ' '.join('%.1f,%.1f %.1f,%.1f' % (x0 + i * bw, py(d), x0 + (i + 1) * bw, py(d))
                       for i, d in enumerate(dens[j + 1]))
        out.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="1.6"/>' % (pts, c))
        if lo <= target <= hi:
            out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" '
                       'stroke-dasharray="4,3"/>' % (px(target), y0, px(target), y0 + H, c))
        mad = sum(abs(v - target) for v in vals) / max(1, len(vals))
        out.append('<text x="%.1f" y="%.1f" font-size="11" fill="%s">%s = %g: MAD %.3f '
                   '(%d valid)</text>' % (x0 + W - 4, y0 + 14 + 13 * j, c, name, target, mad,
                                          len(vals)))
    out[-len(series):] = [t.replace('<text ', '<text text-anchor="end" ') for t in
                          out[-len(series):]]
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        out.append('<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%.3g</text>'
                   % (px(v), y0 + H + 13, v))
    out.append('<text x="%.1f" y="%.1f" font-size="12" text-anchor="middle">%s (grey: the data)'
               '</text>' % (x0 + W / 2, y0 + H + 28, UNITS.get(name, name)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python3 -m molgen.pictures',
                                     description=__doc__.split('\n')[0])
    ap.add_argument('--data', required=True, help="molgen.props's CSV of the training data")
    ap.add_argument('--out', required=True, help='SVG to write')
    ap.add_argument('series', nargs='+', help='NAME=TARGET:SAMPLES.smi')
    a = ap.parse_args(argv)
    panels = {}
    for s in a.series:
        spec, sep, path = s.partition(':')
        name, eq, t = spec.partition('=')
        try:
            target = float(t)
        except ValueError:
            target = float('nan')
        if not sep or not eq or not math.isfinite(target) or not os.path.isfile(path):
            sys.stderr.write('molgen.pictures: %s is not NAME=TARGET:FILE (an existing file)\n' % s)
            return 2
        panels.setdefault(name, []).append((target, path))
    with open(a.data) as f:
        rows = list(csv.DictReader(f))
    for name in panels:
        if not rows or name not in rows[0]:
            sys.stderr.write('molgen.pictures: %s has no column %s\n' % (a.data, name))
            return 2
    W, H, pad = 360, 200, 50
    svg = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">'
           % (len(panels) * (W + pad) + pad, H + 2 * pad),
           '<rect width="100%" height="100%" fill="white"/>']
    for i, (name, items) in enumerate(panels.items()):
        data = [float(r[name]) for r in rows if r[name] not in ('', None)]
        series = [(t, p, sample_values(p, name)) for t, p in items]
        svg += panel(name, data, series, pad + i * (W + pad), pad / 2, W, H)
    svg.append('</svg>')
    with atomic_open(a.out) as f:
        f.write('\n'.join(svg) + '\n')
    print(a.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
