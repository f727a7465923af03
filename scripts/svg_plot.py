"""Plain-Python SVG plotting shared by the report scripts (scripts/quality_report.py,
scripts/data_efficiency_quality.py): a panel of polylines with ticks, grid and a legend, a moving
average, and the file written atomically. No matplotlib, so it runs on any machine.
"""
import math
import os


def smooth(points, window=25):
    out, acc = [], []
    for s, v in points:
        if not math.isfinite(v):
            continue
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append((s, sum(acc) / len(acc)))
    return out


def nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    t = math.ceil(lo / step) * step
    ticks = []
    while t <= hi + 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


def panel(x0, y0, w, h, title, series, ylabel, clip_low=False, xlabel="step"):
    """series: [(label, color, [(x, y)], dashed)]. clip_low: the lower end at the 2nd percentile
    too (a delta plot), else at the lowest value."""
    pts = [p for _, _, ps, _ in series for p in ps if math.isfinite(p[1])]
    g = [f'<g transform="translate({x0},{y0})">',
         f'<text x="{w / 2}" y="-8" text-anchor="middle" font-size="13" font-weight="bold">{title}</text>',
         f'<rect x="0" y="0" width="{w}" height="{h}" fill="none" stroke="#444"/>']
    if not pts:
        g.append(f'<text x="{w / 2}" y="{h / 2}" text-anchor="middle" font-size="12">no data</text></g>')
        return g
    xs = [p[0] for p in pts]
    ys = sorted(p[1] for p in pts)
    xlo, xhi = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    # The start (near ln(vocab)) would flatten the rest: y from the lowest value to the 98th
    # percentile, padded; points above are drawn at the top edge.
    ylo, yhi = ys[int(0.02 * (len(ys) - 1)) if clip_low else 0], ys[int(0.98 * (len(ys) - 1))]
    pad = 0.05 * (yhi - ylo if yhi > ylo else 1)
    ylo, yhi = ylo - pad, yhi + pad
    sx = lambda x: (x - xlo) / (xhi - xlo) * w
    sy = lambda y: h - (min(max(y, ylo), yhi) - ylo) / (yhi - ylo) * h
    for t in nice_ticks(ylo, yhi):
        g.append(f'<line x1="0" x2="{w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#ddd"/>')
        g.append(f'<text x="-4" y="{sy(t) + 4:.1f}" text-anchor="end" font-size="10">{t:g}</text>')
    for t in nice_ticks(xlo, xhi):
        g.append(f'<text x="{sx(t):.1f}" y="{h + 14}" text-anchor="middle" font-size="10">{t:g}</text>')
    g.append(f'<text x="{w / 2}" y="{h + 30}" text-anchor="middle" font-size="11">{xlabel}</text>')
    g.append(f'<text transform="translate(-38,{h / 2}) rotate(-90)" text-anchor="middle" font-size="11">{ylabel}</text>')
    drawn = [(label, color, [p for p in ps if math.isfinite(p[1])], dashed) for label, color, ps, dashed in series]
    drawn = [d for d in drawn if d[2]]
    for label, color, ps, dashed in drawn:
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ps)
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        g.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} points="{d}"/>')
    # The legend in a box over the top right corner.
    g.append(f'<rect x="{w - 196}" y="4" width="192" height="{14 * len(drawn) + 6}" fill="white" '
             f'fill-opacity="0.85" stroke="#bbb"/>')
    for i, (label, color, _, dashed) in enumerate(drawn):
        ly = 18 + 14 * i
        dash = ' stroke-dasharray="5,3"' if dashed else ""
        g.append(f'<line x1="{w - 190}" x2="{w - 170}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" stroke-width="2"{dash}/>')
        g.append(f'<text x="{w - 165}" y="{ly}" font-size="10">{label}</text>')
    g.append("</g>")
    return g


def write_svg_file(path, width, height, parts):
    """parts: the SVG elements (panel() lists and the like), on a white page of width x height."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>'] + parts + ["</svg>"]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(tmp, path)
