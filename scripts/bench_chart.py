#!/usr/bin/env python3
"""Draws the headline ratios (splash / llama.cpp, measured side by side) from benchmarks/headline.json into an SVG.

`python3 scripts/bench_chart.py [--json benchmarks/headline.json] [--out docs/benchmarks.svg]`; standard library only.
A ratio is splash's mean over llama.cpp's mean; where both sides list one figure per run, the median of the per-run
ratios (each run's two engines measured in the same minutes). BENCHMARKS.md gives every figure's commit and command.
"""

import argparse
import json
import statistics
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BAR_H, GAP, LEFT, RIGHT, TOP, SCALE_W = 22, 8, 410, 70, 54, 420


def ratio(entry):
    s, l = entry["splash"], entry["llama_cpp"]
    if isinstance(l, list):
        if len(l) != len(s):
            raise SystemExit(f"{entry['what']}: {len(s)} splash runs against {len(l)} llama.cpp runs")
        return statistics.median(a / b for a, b in zip(s, l))
    return statistics.mean(s) / l


def svg(entries):
    rows = [(e, ratio(e)) for e in entries]
    top = max(3.0, max(r for _, r in rows))
    x = lambda r: LEFT + SCALE_W * r / top  # noqa: E731
    height = TOP + len(rows) * (BAR_H + GAP) + 40
    width = LEFT + SCALE_W + RIGHT
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        '<text x="10" y="22" font-size="15" font-weight="bold">Splash / llama.cpp, side by side in the same run</text>',
        '<text x="10" y="40" fill="#555">higher is faster; dates, commits and commands in BENCHMARKS.md</text>',
    ]
    y = TOP
    for e, r in rows:
        label = f"{e['machine']}: {e['what']}"
        colour = "#2b6cb0" if e["machine"] == "H200" else "#2f855a"
        out.append(f'<text x="{LEFT - 8}" y="{y + BAR_H - 6}" text-anchor="end">{escape(label)}</text>')
        out.append(f'<rect x="{LEFT}" y="{y}" width="{x(r) - LEFT:.1f}" height="{BAR_H}" fill="{colour}"/>')
        out.append(f'<text x="{x(r) + 6:.1f}" y="{y + BAR_H - 6}">{r:.2f}×</text>')
        y += BAR_H + GAP
    for t in range(0, int(top) + 1):
        out.append(f'<line x1="{x(t):.1f}" y1="{TOP - 4}" x2="{x(t):.1f}" y2="{y}" stroke="#999" '
                   f'stroke-dasharray="{"none" if t == 1 else "2,3"}"/>')
        out.append(f'<text x="{x(t):.1f}" y="{y + 16}" text-anchor="middle" fill="#555">{t}×</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/headline.json")
    ap.add_argument("--out", type=Path, default=ROOT / "docs/benchmarks.svg")
    a = ap.parse_args()
    entries = json.loads(a.json.read_text())["entries"]
    a.out.write_text(svg(entries))
    for e in entries:
        print(f"{ratio(e):5.2f}x  {e['machine']}: {e['what']} ({e['commit']}, {e['date']})")


if __name__ == "__main__":
    main()
