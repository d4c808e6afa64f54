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
path counts). `--stream` posts it streaming, as the clients do (the reply is rebuilt from the events), and
`--with BODY2` posts a second captured request at the same moment each time (as OpenCode sends its title request
beside its first turn), so both are decoded in one batch; `--abort-after S` streams that one and closes its connection
after S seconds (as the e2e harness kills a client once its file is written). With `--set temperature=0` the replies
must be token for token those of the request alone: the CPU kernels are batch invariant.

Usage: scripts/e2e/replay.py BODY.json [-n 5] [--port 18000] [--key KEY] [--set temperature=0] [--width 160]
                             [--sub OLD=NEW ...] [--project DIR] [--stream] [--with BODY2 [--abort-after S]]
"""

import argparse
import json
import re
import sys
import threading
import time
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


def read_stream(path, r):
    """The non-streaming form of a streamed reply, rebuilt from its server-sent events."""
    path = path.split("?")[0]
    msg, calls, blocks, done = {"content": ""}, {}, [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        ev = json.loads(line[5:])
        if path.endswith("/responses"):
            if ev.get("type") == "response.completed":
                done = ev["response"]
        elif path.endswith("/messages"):
            t = ev.get("type")
            if t == "content_block_start":
                b = dict(ev["content_block"])
                b["_json"] = ""
                blocks.append(b)
            elif t == "content_block_delta":
                d = ev["delta"]
                if d.get("type") == "text_delta":
                    blocks[-1]["text"] = blocks[-1].get("text", "") + d["text"]
                elif d.get("type") == "input_json_delta":
                    blocks[-1]["_json"] += d["partial_json"]
        else:
            for ch in ev.get("choices") or []:
                d = ch.get("delta") or {}
                msg["content"] += d.get("content") or ""
                for tc in d.get("tool_calls") or []:
                    c = calls.setdefault(tc.get("index", 0), {"function": {"name": "", "arguments": ""}})
                    f = tc.get("function") or {}
                    c["function"]["name"] += f.get("name") or ""
                    c["function"]["arguments"] += f.get("arguments") or ""
    if path.endswith("/responses"):
        return done or {}
    if path.endswith("/messages"):
        for b in blocks:
            if b.get("type") == "tool_use":
                b["input"] = json.loads(b["_json"] or "{}")
        return {"content": blocks}
    msg["tool_calls"] = [calls[k] for k in sorted(calls)]
    return {"choices": [{"message": msg}]}


def open_post(port, key, path, body):
    """The server's response to `body` posted to `path`."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}", "x-api-key": key},
    )
    return urllib.request.urlopen(req, timeout=900)


def post(port, key, path, body):
    with open_post(port, key, path, body) as r:
        return read_stream(path, r) if body.get("stream") else json.load(r)


def post_and_abort(port, key, path, body, after_s):
    """Streams `body` and closes the connection after `after_s` seconds (the server then aborts the request)."""
    t0 = time.monotonic()
    with open_post(port, key, path, dict(body, stream=True)) as r:
        while time.monotonic() - t0 < after_s and r.readline():
            pass


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
    ap.add_argument("--stream", action="store_true", help="post streaming, as the clients do")
    ap.add_argument("--with", dest="companion", help="a second captured request, posted at the same moment each time")
    ap.add_argument("--abort-after", type=float, help="close the second request's connection after this many seconds")
    a = ap.parse_args()
    head, body = load(a.body)
    if a.sub:
        text = json.dumps(body)
        for s in a.sub:
            old, new = s.split("=", 1)
            text = text.replace(old, new)
        body = json.loads(text)
    path = head.get("path") or head.get("url") or "/v1/chat/completions"
    body["stream"] = a.stream
    if not a.stream:
        body.pop("stream_options", None)
    for s in a.set:
        k, v = s.split("=", 1)
        body[k] = json.loads(v)
    if a.companion:
        head2, body2 = load(a.companion)
        path2 = head2.get("path") or "/v1/chat/completions"
        side_target, side_args = (post, ()) if a.abort_after is None else (post_and_abort, (a.abort_after,))
    written = 0
    for i in range(a.n):
        side = None
        if a.companion:
            side = threading.Thread(target=side_target, args=(a.port, a.key, path2, body2, *side_args))
            side.start()
        reply = post(a.port, a.key, path, body)
        if side:
            side.join()
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
    how = " ".join(a.set) or "as captured"
    how += ", streamed" if a.stream else ""
    how += f", beside {a.companion}" if a.companion else ""
    how += f" (closed after {a.abort_after} s)" if a.abort_after is not None else ""
    print(f"{written} of {a.n} replies write hello.txt with hi ({path}, {how})")


if __name__ == "__main__":
    main()
