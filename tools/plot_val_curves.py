#!/usr/bin/env python3
"""SVG of validation loss against wall-clock time for training runs
(docs/molgen.md, The ZINC prior), from their stderr's validation lines:
molgen train's ("step S/T: train loss X, val loss Y, ..., 1h12m") and
tools/train_prior_torch.py's ("step S: ..., val loss Y (...), ..., 420 s, ...").

    tools/plot_val_curves.py OUT.svg [--title T] [--unit h|min] [--ymax Y]
        LABEL=FILE [LABEL=FILE ...]
"""
import argparse
import math
import re

COLOURS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e']


def parse(path):
    """[(seconds, val loss)] of one run's stderr; the step-0 loss at 0 s."""
    pts = []
    for line in open(path, encoding='utf-8'):
        m = re.match(r'step 0: val loss ([\d.]+)', line)
        if m:
            pts = [(0.0, float(m.group(1)))]
            continue
        if not line.startswith(('step ', 'finished at step ')) or 'val loss' not in line:
            continue
        v = float(re.search(r'val loss ([\d.]+)', line).group(1))
        m = re.search(r', ([\d.]+) s,', line)
        if m:
            pts.append((float(m.group(1)), v))
            continue
        m = re.search(r', (?:(\d+)h)?(\d+)m(?:(\d+)s)?(?:;.*)?\s*$', line)
        if m:
            pts.append((int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + int(m.group(3) or 0), v))
    return pts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('out')
    ap.add_argument('runs', nargs='+', help='LABEL=FILE')
    ap.add_argument('--title', default='validation loss (nats/token) by wall-clock time')
    ap.add_argument('--unit', choices=('h', 'min'), default='h')
    ap.add_argument('--ymin', type=float, default=0.55)
    ap.add_argument('--ymax', type=float, default=0.80)
    a = ap.parse_args(argv)
    div = 3600.0 if a.unit == 'h' else 60.0
    runs = []
    for i, r in enumerate(a.runs):
        label, path = r.rsplit('=', 1)
        runs.append((label, [(s / div, v) for s, v in parse(path)], COLOURS[i % len(COLOURS)]))
    xmax = max(p[0] for _, pts, _ in runs for p in pts)
    step = 0.5 if a.unit == 'h' else 1.0
    while xmax / step > 8:
        step *= 2
    x1 = math.ceil(xmax / step) * step
    W, H, L, R, T, B = 600, 320, 60, 20, 30, 45
    y0, y1 = a.ymin, a.ymax
    X = lambda h: L + (W - L - R) * h / x1
    Y = lambda v: T + (H - T - B) * (y1 - min(max(v, y0), y1)) / (y1 - y0)
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" '
         'font-size="12">' % (W, H), '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="18" font-size="13">%s</text>' % (L, a.title)]
    ny = int(round((y1 - y0) / 0.05))
    for i in range(ny + 1):
        v = y0 + i * 0.05
        o.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" '
                 'text-anchor="end">%.2f</text>' % (L, W - R, Y(v), Y(v), L - 5, Y(v) + 4, v))
    k = 0
    while k * step <= x1 + 1e-9:
        h = k * step
        o.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" '
                 'text-anchor="middle">%g %s</text>' % (X(h), X(h), T, H - B, X(h), H - B + 16, h, a.unit))
        k += 1
    for n, (name, pts, col) in enumerate(runs):
        pts = [p for p in pts if p[0] > 0]
        o.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                 % (col, ' '.join('%.1f,%.1f' % (X(h), Y(v)) for h, v in pts)))
        for h, v in pts:
            o.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (X(h), Y(v), col))
        best = min(v for _, v in pts)
        o.append('<text x="%d" y="%d" fill="%s">%s: best %.4f</text>'
                 % (W - R - 330, T + 20 + 16 * n, col, name, best))
    o.append('<text x="%d" y="%d" text-anchor="middle">step-0 losses (~4.2) and points above %.2f '
             'drawn at the top edge</text>' % ((L + W) // 2, H - 8, y1))
    o.append('</svg>')
    with open(a.out, 'w', encoding='utf-8') as f:
        f.write('\n'.join(o) + '\n')


if __name__ == '__main__':
    main()
