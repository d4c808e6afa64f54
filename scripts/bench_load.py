#!/usr/bin/env python3
"""HTTP load: concurrent streaming Chat Completions with fresh prompts against `splash serve` and `llama-server`.

For each server (started here on a free loopback port, on the same model file, one after the other; or already
running with --url / --llama-url) and each concurrency N in --streams, sends N greedy streaming requests at once,
each with a prompt of its own (about --prompt-tokens tokens of text that no other request shares, so the prefix cache
gives nothing), and reports per round: requests that failed, completion tokens, aggregate tokens/s (all completion
tokens over the wall time from the first send to the last reply, prefill included), time to first token p50 / p90 /
max, the median request's decode rate, and Splash's aggregate over llama-server's. Uses only the standard library.

    python3 scripts/bench_load.py --gguf ~/.cache/splash/models/qwen2.5-coder-1.5b-q4_k_m.gguf --streams 1,16,64 \\
        --prompt-tokens 1000 --max-tokens 256 --llama-server /path/to/llama-server
    python3 scripts/bench_load.py --model qwen2.5-coder-0.5b --streams 1,4 --prompt-tokens 200 --max-tokens 64
    python3 scripts/bench_load.py --model qwen2.5-coder-1.5b --streams 1,8 --prompt-tokens 0 --max-tokens 128  # CPU

Without --llama-server (and --llama-url) only Splash runs. The same prompts go to both servers.
"""

import argparse
import concurrent.futures
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request

WORDS = ("buffer parser token stream cache vector graph queue thread socket handler module schema request reply "
         "channel batch kernel tensor layer index shard replica commit branch merge review config option value "
         "record field column table query plan cursor lock mutex signal event timer clock budget window frame "
         "packet header payload digest cipher entropy sample matrix column scalar offset stride block page").split()
TASKS = ["a linked list", "a binary heap", "an LRU cache", "a trie", "a ring buffer", "a bloom filter",
         "a union-find", "an interval tree", "a skip list", "a B-tree", "a hash map", "a deque",
         "a segment tree", "a Fenwick tree", "a graph with BFS", "a red-black tree"]


def prompt(round_no, i, num_tokens):
    """A prompt no other request shares from its first token on: a numbered note of random words, then a task
    (`num_tokens` 0: the task alone, the short prompts the CPU's 8-stream measurements used)."""
    task = f"Write a complete, well commented Python implementation of {TASKS[i % len(TASKS)]} with tests."
    if num_tokens == 0:
        return task
    rng = random.Random(round_no * 100_003 + i)
    words = " ".join(rng.choice(WORDS) for _ in range(int(num_tokens / 1.3)))
    return f"Note {round_no}-{i}: {words}\n\nIgnore the note above. {task}"


def post(url, key, body):
    """Streams one request: (completion tokens, seconds, time to first token or None, error or None)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    t0 = time.time()
    first, deltas, tokens = None, 0, None
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    first = first or time.time() - t0
                    deltas += 1
    except Exception as e:  # a failed request is counted, never retried
        return 0, time.time() - t0, first, f"{type(e).__name__}: {e}"
    # Both servers send one delta per token; the usage, where sent, is exact.
    return tokens if tokens is not None else deltas, time.time() - t0, first, None


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_round(url, key, round_no, n, a):
    bodies = [{"model": "m", "messages": [{"role": "user", "content": prompt(round_no, i, a.prompt_tokens)}],
               "max_tokens": a.max_tokens, "temperature": 0} for i in range(n)]
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        results = list(ex.map(lambda b: post(url, key, b), bodies))
    wall = time.time() - t0
    ok = [r for r in results if r[3] is None]
    ttft = [r[2] for r in ok if r[2] is not None]
    decode = [(t - 1) / (s - f) for t, s, f, _ in ok if f is not None and t > 1 and s > f]
    return {"streams": n, "failed": len(results) - len(ok), "errors": sorted({r[3] for r in results if r[3]})[:3],
            "tokens": sum(r[0] for r in ok), "wall_s": wall, "tok_s": sum(r[0] for r in ok) / wall,
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9), "ttft_max_s": max(ttft, default=float("nan")),
            "decode_tok_s_median": pct(decode, 0.5)}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_http(url, proc, what, timeout_s=900):
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            sys.exit(f"{what} exited before it was ready (code {proc.returncode}); its log: {proc.args_log}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit(f"{what} was not ready after {timeout_s} s")


def start(cmd, url, what, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    proc.args_log = log_path
    wait_http(url, proc, what)
    return proc


def engine_times(url, key):
    """Splash's /status split of the engine thread's time (seconds by phase), or None (llama-server has none)."""
    try:
        req = urllib.request.Request(url + "/status", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            e = json.load(r)["engine"]
        return dict(e["step_seconds"], steps=e["num_steps"], preemptions=e["preemptions"])
    except Exception:
        return None


def bench(name, url, key, a):
    post(url, key, {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8})  # warm-up
    rows = []
    for round_no, n in enumerate(int(x) for x in a.streams.split(",")):
        before = engine_times(url, key)
        r = run_round(url, key, round_no + 1, n, a)
        after = engine_times(url, key)
        r["server"] = name
        if before and after:
            # Where the engine thread's time went during the round; the rest of the wall time it was idle (waiting
            # for requests: HTTP parsing, templating, tokenising happen on the server's other threads).
            r["engine_s"] = {k: after[k] - before[k] for k in after}
        rows.append(r)
        print(f"{name:>12} {n:>7} {r['failed']:>6} {r['tokens']:>7} {r['wall_s']:>7.1f} {r['tok_s']:>8.1f} "
              f"{r['ttft_p50_s']:>9.2f} {r['ttft_p90_s']:>9.2f} {r['ttft_max_s']:>9.2f} {r['decode_tok_s_median']:>10.1f}"
              + (f"  errors: {r['errors']}" if r["errors"] else ""), flush=True)
        if "engine_s" in r:
            t = r["engine_s"]
            steps = max(t["steps"], 1)
            phases = ["schedule", "draft", "runner", "update", "dispatch"]
            busy = sum(t[k] for k in phases)
            print(f"{'':>12} engine thread per step ({t['steps']} steps, {t['preemptions']} preemptions): "
                  + ", ".join(f"{k} {1e3 * t[k] / steps:.2f} ms" for k in phases)
                  + f"; idle {100 * max(0.0, 1 - busy / r['wall_s']):.0f}% of the wall time", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", help="the model file both servers load")
    ap.add_argument("--model", help="what `splash serve --model` gets (default: --gguf)")
    ap.add_argument("--streams", default="1,16,64")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--splash", default="target/release/splash")
    ap.add_argument("--serve-args", default="", help="extra `splash serve` arguments")
    ap.add_argument("--url", help="a running Splash server instead of starting one")
    ap.add_argument("--llama-server", help="the llama-server binary to compare with")
    ap.add_argument("--llama-args", default="", help="extra llama-server arguments (default: -np <most streams>, "
                                                     "a context for that many requests, -ngl 999)")
    ap.add_argument("--llama-url", help="a running llama-server instead of starting one")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    model = a.model or a.gguf
    if not (model or a.url):
        sys.exit("give --gguf (or --model, or --url)")
    key = "bench-load"
    most = max(int(x) for x in a.streams.split(","))
    print(f"{a.prompt_tokens}-token fresh prompts, {a.max_tokens} new tokens, greedy; machine {os.uname().nodename}")
    print(f"{'server':>12} {'streams':>7} {'failed':>6} {'tokens':>7} {'wall s':>7} {'tok/s':>8} "
          f"{'TTFT p50':>9} {'TTFT p90':>9} {'TTFT max':>9} {'decode/req':>10}")
    rows = []
    servers = [("splash", a.url)]
    if a.llama_server or a.llama_url:
        servers.append(("llama-server", a.llama_url))
    for name, url in servers:
        proc = None
        if not url:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            if name == "splash":
                cmd = [a.splash, "serve", "--model", model, "--port", str(port), "--api-key", key]
                cmd += a.serve_args.split()
            else:
                if not a.gguf:
                    sys.exit("llama-server needs --gguf")
                ctx = most * (a.prompt_tokens + a.max_tokens + 256)
                extra = a.llama_args.split() or ["-np", str(most), "-c", str(ctx), "-ngl", "999"]
                cmd = [a.llama_server, "-m", a.gguf, "--port", str(port), "--api-key", key] + extra
            proc = start(cmd, url, name, f"/tmp/bench_load_{name}.log")
        try:
            rows += bench(name, url, key, a)
        finally:
            if proc:
                proc.terminate()
                proc.wait()
    by = {(r["server"], r["streams"]): r for r in rows}
    for n in (int(x) for x in a.streams.split(",")):
        s, l = by.get(("splash", n)), by.get(("llama-server", n))
        if s and l and l["tok_s"] > 0:
            print(f"{n:>3} streams: Splash {s['tok_s'] / l['tok_s']:.2f}x llama-server's tokens/s; TTFT p50 "
                  f"{s['ttft_p50_s']:.2f} vs {l['ttft_p50_s']:.2f} s, p90 {s['ttft_p90_s']:.2f} vs {l['ttft_p90_s']:.2f} s")
    one = by.get(("splash", 1))
    for n in (int(x) for x in a.streams.split(",")):
        if one and n > 1 and ("splash", n) in by and one["tok_s"] > 0:
            print(f"Splash at {n} streams: {by[('splash', n)]['tok_s'] / one['tok_s']:.2f}x one stream")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"model": model, "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens,
                       "serve_args": a.serve_args, "llama_args": a.llama_args, "rounds": rows,
                       "machine": os.uname().nodename}, f, indent=1)


if __name__ == "__main__":
    main()
