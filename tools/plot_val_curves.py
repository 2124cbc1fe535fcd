"""SVG of validation loss against wall-clock hours for the two ZINC prior runs
(docs/molgen.md, The ZINC prior): tools/plot_val_curves.py OUT.svg A.err B.err,
the runs' stderr (their validation lines)."""
import re, sys
def parse(path):
    pts = [(0.0, None)]
    for line in open(path):
        m = re.match(r'step (\d+): val loss ([\d.]+)', line)
        if m:
            pts = [(0.0, float(m.group(2)))]
            continue
        m = re.search(r'val loss ([\d.]+).*?, (?:(\d+)h)?(\d+)m(?:(\d+)s)?', line)
        if m and ('step' in line):
            h = int(m.group(2) or 0) + int(m.group(3)) / 60 + int(m.group(4) or 0) / 3600
            pts.append((h, float(m.group(1))))
    return pts
runs = [('6 layers, d_model 128 (1.23 M; shipped)', parse(sys.argv[2]), '#1f77b4'),
        ('8 layers, d_model 192 (3.61 M)', parse(sys.argv[3]), '#d62728')]
W, H, L, R, T, B = 560, 300, 60, 20, 30, 45
x0, x1, y0, y1 = 0.0, 2.0, 0.55, 0.80
X = lambda h: L + (W - L - R) * (h - x0) / (x1 - x0)
Y = lambda v: T + (H - T - B) * (y1 - min(max(v, y0), y1)) / (y1 - y0)
o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
     '<rect width="100%" height="100%" fill="white"/>',
     '<text x="%d" y="18" font-size="13">ZINC250k validation loss (nats/token) by wall-clock hour, one core each</text>' % L]
for i in range(6):
    v = y0 + i * 0.05
    o.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.2f</text>' % (L, W - R, Y(v), Y(v), L - 5, Y(v) + 4, v))
for i in range(5):
    h = i * 0.5
    o.append('<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%.1f h</text>' % (X(h), X(h), T, H - B, X(h), H - B + 16, h))
for k, (name, pts, col) in enumerate(runs):
    pts = [p for p in pts if p[1] is not None and p[0] > 0]
    o.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (col, ' '.join('%.1f,%.1f' % (X(h), Y(v)) for h, v in pts)))
    for h, v in pts:
        o.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (X(h), Y(v), col))
    o.append('<text x="%d" y="%d" fill="%s">%s: %.4f at %.2f h</text>' % (L + 10, Y(0.585) + 16 * k, col, name, pts[-1][1], pts[-1][0]))
o.append('<text x="%d" y="%d" text-anchor="middle">the step-0 losses (4.14, 4.22) are off the scale</text>' % ((L + W) // 2, H - 8))
o.append('</svg>')
open(sys.argv[1], 'w').write('\n'.join(o) + '\n')
