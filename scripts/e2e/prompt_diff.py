#!/usr/bin/env python3
"""Where two captured agent requests stop sharing a prefix, for finding why prefix reuse misses.

Reads two request bodies written by agents_proxy.py (AGENTS_PROXY_BODIES=DIR: first line the path and headers,
then the JSON body) and prints every difference, walking the JSON in order (headers too): for strings, the first
differing character with 150 characters of context on each side. The first difference in `system`, `tools` or
`messages` is where the rendered prompt — and so the reusable prefix — ends.

Usage: scripts/e2e/prompt_diff.py WORK/bodies/0001.json WORK/bodies/0003.json
"""

import json
import sys


def load(path):
    with open(path, "rb") as f:
        head = json.loads(f.readline())
        return head, json.loads(f.read())


def walk(a, b, path=""):
    if type(a) is not type(b):
        print(f"TYPE {path}: {str(a)[:300]!r} | {str(b)[:300]!r}")
    elif isinstance(a, dict):
        for k in dict.fromkeys([*a, *b]):
            if k not in a or k not in b:
                print(f"KEY  {path}/{k}: {str(a.get(k))[:200]!r} | {str(b.get(k))[:200]!r}")
            else:
                walk(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        if len(a) != len(b):
            print(f"LEN  {path}: {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}[{i}]")
    elif a != b:
        if isinstance(a, str):
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"STR  {path} at char {i} of {len(a)}:\n  {a[max(0, i - 150):i + 150]!r}\n  {b[max(0, i - 150):i + 150]!r}")
        else:
            print(f"VAL  {path}: {a!r} | {b!r}")


if __name__ == "__main__":
    (ha, a), (hb, b) = load(sys.argv[1]), load(sys.argv[2])
    walk(ha.get("headers", {}), hb.get("headers", {}), "headers")
    walk(a, b)
