#!/usr/bin/env python3
"""Replays a captured agent request against `splash serve` N times and says what the model did each time.

For reading why a tool turn failed (scripts/e2e/agents.sh keeps every request body under WORK/bodies/ through
agents_proxy.py): the same prompt posted again, non-streaming, shows the spread of the model's replies at the
server's sampling, and `--set KEY=JSON` shows what a change to the request does (e.g. `--set temperature=0`).
Each reply is printed as its text and its tool calls (name and arguments, cut to --width characters), then, for the
tool turn's task, whether a call creates hello.txt holding `hi` (the first such call; a write by a shell command
counts when it redirects into hello.txt). Stdlib only.

`--sub OLD=NEW` replaces a string everywhere in the body first (e.g. the run's directories by other paths, to see
how the model's choice of path depends on them), and `--project DIR` counts only files written there (a relative
path counts).

Usage: scripts/e2e/replay.py BODY.json [-n 5] [--port 18000] [--key KEY] [--set temperature=0] [--width 160]
                             [--sub OLD=NEW ...] [--project DIR]
"""

import argparse
import json
import re
import sys
import urllib.request


def load(path):
    with open(path, "rb") as f:
        head = json.loads(f.readline())
        return head, json.loads(f.read())


def calls_of(path, reply):
    """(text, [(name, arguments dict)]) of a non-streaming reply in any of the three protocols."""
    text, calls = "", []
    path = path.split("?")[0]
    if path.endswith("/messages"):
        for b in reply.get("content", []):
            if b.get("type") == "text":
                text += b.get("text", "")
            elif b.get("type") == "tool_use":
                calls.append((b.get("name"), b.get("input") or {}))
    elif path.endswith("/responses"):
        for item in reply.get("output", []):
            if item.get("type") == "message":
                text += "".join(c.get("text", "") for c in item.get("content", []))
            elif item.get("type") == "function_call":
                calls.append((item.get("name"), json.loads(item.get("arguments") or "{}")))
    else:
        m = (reply.get("choices") or [{}])[0].get("message") or {}
        text = m.get("content") or ""
        for tc in m.get("tool_calls") or []:
            f = tc.get("function") or {}
            calls.append((f.get("name"), json.loads(f.get("arguments") or "{}")))
    return text, calls


REDIRECT = re.compile(r"""(?:echo|printf)\s+(?:-e\s+)?['"]?hi(?:\\n)?['"]?\s*>\s*['"]?(?:\./)?(\S*/)?hello\.txt\b""")


def writes_hello(name, args):
    """Where a call writes hello.txt holding `hi`: the path it gives, or None."""
    path = next((args[k] for k in ("file_path", "filePath", "path") if isinstance(args.get(k), str)), None)
    content = next((args[k] for k in ("content", "text") if isinstance(args.get(k), str)), None)
    if path and path.rstrip().endswith("hello.txt") and content is not None and content.strip() == "hi":
        return path
    for k in ("command", "cmd"):
        v = args.get(k)
        v = " ".join(v) if isinstance(v, list) else v
        if isinstance(v, str) and (m := REDIRECT.search(v)):
            return (m.group(1) or "") + "hello.txt"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("body")
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--port", type=int, default=18000)
    ap.add_argument("--key", default="e2e-agents-key")
    ap.add_argument("--set", action="append", default=[], help="KEY=JSON, set in the body before posting")
    ap.add_argument("--width", type=int, default=160)
    ap.add_argument("--sub", action="append", default=[], help="OLD=NEW, replaced everywhere in the body")
    ap.add_argument("--project", help="count only files written in this directory (or at a relative path)")
    a = ap.parse_args()
    head, body = load(a.body)
    if a.sub:
        text = json.dumps(body)
        for s in a.sub:
            old, new = s.split("=", 1)
            text = text.replace(old, new)
        body = json.loads(text)
    path = head.get("path") or head.get("url") or "/v1/chat/completions"
    body["stream"] = False
    body.pop("stream_options", None)
    for s in a.set:
        k, v = s.split("=", 1)
        body[k] = json.loads(v)
    written = 0
    for i in range(a.n):
        req = urllib.request.Request(
            f"http://127.0.0.1:{a.port}{path}",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json", "authorization": f"Bearer {a.key}", "x-api-key": a.key},
        )
        with urllib.request.urlopen(req, timeout=900) as r:
            reply = json.load(r)
        text, calls = calls_of(path, reply)
        where = next((w for w in (writes_hello(n, c) for n, c in calls) if w), None)
        inside = where is not None and (
            not a.project or not where.startswith("/") or where.rsplit("/", 1)[0] == a.project.rstrip("/")
        )
        written += inside
        verdict = "no" if where is None else f"writes {where}" + ("" if inside else " (outside the project)")
        shown = "; ".join(f"{n} {json.dumps(c)}"[: a.width] for n, c in calls)
        print(f"{i + 1:>3}: {verdict} | calls: {shown or '-'} | text: {text[: a.width]!r}")
        sys.stdout.flush()
    print(f"{written} of {a.n} replies write hello.txt with hi ({path}, {' '.join(a.set) or 'as captured'})")


if __name__ == "__main__":
    main()
