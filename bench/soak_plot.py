#!/usr/bin/env python3
"""Draws a soak run's samples (quire-bench typing --sample-every ... --samples FILE) as an SVG:
the server's RSS and its open file descriptors against time, one panel each, and prints the
first, last, lowest and highest of each after the first minute.
Usage: soak_plot.py soak.jsonl soak.svg"""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
t = [r["t_s"] / 60 for r in rows]
series = [
    ("server RSS (MiB)", [(r.get("rss_kib") or 0) / 1024 for r in rows], "#1f77b4"),
    ("open file descriptors", [r.get("fds") or 0 for r in rows], "#d62728"),
]
W, PH, L, B, GAP = 640, 200, 70, 40, 30
H = 2 * PH + GAP + B
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>']
tmax = max(t + [1])
for k, (name, ys, color) in enumerate(series):
    top = 10 + k * (PH + GAP)
    bottom = top + PH - 20
    ymax = max(ys + [1]) * 1.15
    sx = lambda x: L + (W - L - 20) * x / tmax
    sy = lambda y: bottom - (bottom - top - 10) * y / ymax
    svg.append(f'<line x1="{L}" y1="{bottom}" x2="{W-20}" y2="{bottom}" stroke="black"/>')
    svg.append(f'<line x1="{L}" y1="{top}" x2="{L}" y2="{bottom}" stroke="black"/>')
    svg.append(f'<text x="{L+10}" y="{top+14}" fill="{color}">{name}</text>')
    for i in range(5):
        y = ymax * i / 4
        svg.append(f'<text x="{L-6}" y="{sy(y)+4}" text-anchor="end">{y:,.0f}</text>')
        x = tmax * i / 4
        svg.append(f'<text x="{sx(x)}" y="{bottom+14}" text-anchor="middle">{x:.1f}</text>')
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(t, ys))
    svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
    steady = [y for x, y in zip(t, ys) if x >= 1] or ys
    print(f"{name}: first {ys[0]:,.1f}, after 1 min min {min(steady):,.1f} max {max(steady):,.1f}, "
          f"last {ys[-1]:,.1f}")
svg.append(f'<text x="{(W+L)/2}" y="{H-8}" text-anchor="middle">minutes</text>')
svg.append("</svg>")
open(sys.argv[2], "w").write("\n".join(svg) + "\n")
last = rows[-1]
print(f"{last['sent']:,} updates sent, {last['delivered']:,} delivered, {last['errors']} client errors")
print(f"plot written to {sys.argv[2]}")
