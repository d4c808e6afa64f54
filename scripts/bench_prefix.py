#!/usr/bin/env python3
"""Prefix reuse: time to first token of a request sharing a long prefix with an earlier one, against the cold one.

    scripts/bench_prefix.py [--model qwen2.5-coder-1.5b] [--prefix-tokens 4096] [--splash target/release/splash]

Starts `splash serve` (no disk prefix cache, so the first request is truly cold), sends a chat request whose system
prompt is ~N tokens of code with one user question (streaming, max_tokens 8), then the same system prompt with a
different question. Prints the time to first token of each, the prompt tokens served from the cache (from /status)
and the ratio. (Warm after a restart, from the disk cache, is tested in crates/engine/tests/speculation.rs.)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

CHUNK = '''
def handle_request_{i}(request, db, cache):
    """Validate request {i}, look it up in the cache, fall back to the database, and record metrics."""
    key = f"req:{i}:{{request.user_id}}:{{request.path}}"
    if (hit := cache.get(key)) is not None:
        metrics.increment("cache_hit_{i}")
        return hit
    row = db.query("SELECT payload FROM items WHERE id = %s AND owner = %s", (request.item_id, request.user_id))
    if row is None:
        raise NotFound(f"item {{request.item_id}} not found for user {{request.user_id}}")
    cache.set(key, row.payload, ttl=300 + {i})
    return row.payload
'''


def post(port, body, stream=True):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    with urllib.request.urlopen(req) as r:
        for line in r:
            if not line.startswith(b"data: {") or ttft is not None:
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                ttft = time.perf_counter() - t0
    return ttft


def status(port):
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status"))


def start(args, port, extra, log):
    p = subprocess.Popen([args.splash, "serve", "--model", args.model, "--port", str(port), *extra],
                         stdout=subprocess.PIPE, stderr=log, text=True)
    for line in p.stdout:
        if line.startswith("Ready"):
            return p
    raise SystemExit("server did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--prefix-tokens", type=int, default=4096)
    ap.add_argument("--splash", default="target/release/splash")
    ap.add_argument("--port", type=int, default=8131)
    args = ap.parse_args()
    # ~190 tokens per chunk.
    system = "You are a code reviewer. The project's source follows.\n" + "".join(
        CHUNK.format(i=i) for i in range(max(1, args.prefix_tokens // 190)))
    body = lambda q: {"model": "m", "stream": True, "max_tokens": 8, "temperature": 0,
                      "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]}
    log = open(os.path.join(tempfile.mkdtemp(prefix="splash-prefix-bench-"), "serve.log"), "w")
    results = {}
    p = start(args, args.port, ["--prefix-cache-disk", "0"], log)
    try:
        s0 = status(args.port)["kv_cache"]["prefix_hit_tokens"]
        results["cold_s"] = post(args.port, body("Which function handles request 3?"))
        s1 = status(args.port)["kv_cache"]["prefix_hit_tokens"]
        results["warm_s"] = post(args.port, body("Summarize the caching policy."))
        s2 = status(args.port)["kv_cache"]["prefix_hit_tokens"]
        results["cold_cached_tokens"] = s1 - s0
        results["warm_cached_tokens"] = s2 - s1
    finally:
        p.terminate()
        p.wait()
    results["prompt_tokens_approx"] = args.prefix_tokens
    results["warm_over_cold"] = results["warm_s"] / results["cold_s"]
    print(json.dumps(results))
    print(f"cold TTFT {results['cold_s']:.2f} s, warm TTFT {results['warm_s']:.2f} s "
          f"({100 * results['warm_over_cold']:.1f}% of cold); cached tokens {results['warm_cached_tokens']}")


if __name__ == "__main__":
    main()
