#!/usr/bin/env python3
"""Aggregate decode throughput of `splash serve` with N concurrent requests, against one request alone.

Starts `splash serve` on a free loopback port (or uses --url), then for each N in --streams sends N identical-length
greedy Chat Completions requests at once (different prompts, so nothing is shared), waits for all, and reports
aggregate generated tokens per second (sum of usage.completion_tokens over the wall time from the first send to the
last reply, prompts' prefill included), the aggregate decode rate (tokens streamed while every request decodes: from
the last stream's first token to the first stream's last token), per-request tok/s, and the ratios to N = 1. Uses
only the standard library.

    python3 scripts/bench_load.py --model qwen2.5-coder-1.5b --streams 1,8 --max-tokens 128 [--serve-args "--spec-mode off"]
"""

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

TOPICS = ["a linked list", "a binary heap", "an LRU cache", "a trie", "a ring buffer", "a bloom filter",
          "a union-find", "an interval tree", "a skip list", "a B-tree", "a hash map", "a deque",
          "a segment tree", "a Fenwick tree", "a graph with BFS", "a red-black tree"]


def post(url, body, key):
    """Streams one request; returns (completion tokens, seconds, arrival time of every text delta)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    t0 = time.time()
    stamps, tokens = [], 0
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                stamps.append(time.time())
    return tokens, time.time() - t0, stamps


def run_round(url, key, n, max_tokens):
    bodies = [{
        "model": "splash",
        "messages": [{"role": "user", "content": f"Write a complete, well commented Python implementation of "
                                                 f"{TOPICS[i % len(TOPICS)]} with tests."}],
        "max_tokens": max_tokens, "temperature": 0,
    } for i in range(n)]
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(lambda b: post(url, b, key), bodies))
    wall = time.time() - t0
    tokens = [t for t, _, _ in results]
    per = [t / s for t, s, _ in results]
    # The window in which every stream decodes: from the last stream's first token to the first stream's last one
    # (no prompt is being prefilled then). Text deltas stand for tokens (the server sends one per token).
    start = max(st[0] for _, _, st in results if st)
    end = min(st[-1] for _, _, st in results if st)
    in_window = sum(sum(1 for x in st if start < x <= end) for _, _, st in results)
    decode = in_window / (end - start) if end > start else float("nan")
    return {"streams": n, "wall_s": wall, "tokens": sum(tokens), "aggregate_tok_s": sum(tokens) / wall,
            "decode_window_s": end - start, "aggregate_decode_tok_s": decode, "per_request_tok_s": per}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--splash", default="target/release/splash")
    ap.add_argument("--url", help="use a running server instead of starting one")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--serve-args", default="", help="extra `splash serve` arguments, e.g. \"--spec-mode off\"")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    key = "bench-load"
    server = None
    url = a.url
    if not url:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        cmd = [a.splash, "serve", "--model", a.model, "--port", str(port), "--api-key", key]
        if a.threads:
            cmd += ["-t", str(a.threads)]
        cmd += a.serve_args.split()
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in server.stdout:
            if line.startswith("Ready"):
                break
        else:
            sys.exit("splash serve exited before it was ready")
        url = f"http://127.0.0.1:{port}"
    try:
        run_round(url, key, 1, 8)  # warm-up
        rows = [run_round(url, key, int(n), a.max_tokens) for n in a.streams.split(",")]
    finally:
        if server:
            server.terminate()
            server.wait()
    base = rows[0]["aggregate_tok_s"]
    base_decode = rows[0]["aggregate_decode_tok_s"]
    print(f"{a.model}: {a.max_tokens} max tokens per request, greedy {a.serve_args}")
    print(f"{'streams':>7} {'tokens':>7} {'wall s':>7} {'aggregate tok/s':>16} {'x one stream':>13} "
          f"{'decode-only tok/s':>18} {'x one stream':>13} {'per request tok/s':>18}")
    for r in rows:
        per = sorted(r["per_request_tok_s"])[len(r["per_request_tok_s"]) // 2]
        print(f"{r['streams']:>7} {r['tokens']:>7} {r['wall_s']:>7.1f} {r['aggregate_tok_s']:>16.1f} "
              f"{r['aggregate_tok_s'] / base:>13.2f} {r['aggregate_decode_tok_s']:>18.1f} "
              f"{r['aggregate_decode_tok_s'] / base_decode:>13.2f} {per:>18.1f}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"model": a.model, "max_tokens": a.max_tokens, "serve_args": a.serve_args, "rounds": rows,
                       "machine": os.uname().nodename}, f, indent=1)


if __name__ == "__main__":
    main()
