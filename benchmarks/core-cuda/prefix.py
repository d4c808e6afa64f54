#!/usr/bin/env python3
"""GPU prefix cache: TTFT of a request repeating a ~16K-token prefix with ~50 new tokens, cold / warm / after a
restart with the disk tier / after a restart without it (recompute). Non-streaming, max_tokens 1: the reply time is
the first token's. Usage: prefix.py SPLASH MODEL.gguf PORT DISK_BUDGET [PREFIX_TOKENS]"""
import json, os, signal, subprocess, sys, time, urllib.request

B, M, PORT, DISK = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
N = int(sys.argv[5]) if len(sys.argv) > 5 else 16384
HOME = os.environ["SPLASH_HOME"]

def start(disk):
    p = subprocess.Popen([B, "serve", "--model", M, "--device", "cuda", "--port", str(PORT), "--max-context", "20480",
                          "--prefix-cache-disk", disk], stdout=subprocess.PIPE, stderr=open(f"/tmp/serve_{PORT}.log", "a"),
                         text=True)
    for line in p.stdout:
        if line.startswith("Ready"):
            return p
    raise SystemExit("server did not start: " + open(f"/tmp/serve_{PORT}.log").read()[-2000:])

def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill(); p.wait()

def post(system, user):
    body = {"model": "m", "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    r = json.load(urllib.request.urlopen(req, timeout=300))
    post.last = r["choices"][0]["message"].get("content")
    return time.perf_counter() - t0, r.get("usage", {}).get("prompt_tokens")

def status():
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{PORT}/status"))

def kv():
    return status()["kv_cache"]

def phases(f, *a):
    """Runs post(*a) and returns (seconds, the engine thread's seconds per step phase spent on it, from /status)."""
    def steps(s):
        return next(v["step_seconds"] for v in s.values() if isinstance(v, dict) and "step_seconds" in v)
    s0 = steps(status())
    t, _ = f(*a)
    s1 = steps(status())
    return t, {k: round(s1[k] - s0[k], 4) for k in s1}

def words(seed, n):
    # Deterministic pseudo-text (letters and spaces), different per seed.
    x, out = seed * 2654435761 % 2**32 or 1, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % 2**31
        out.append("".join(chr(97 + (x >> (3 * j)) % 26) for j in range(2 + x % 6)))
    return " ".join(out)

def disk_bytes():
    tot = 0
    for root, _, files in os.walk(os.path.join(HOME, "prefix-cache")):
        tot += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith(".kv"))
    return tot

res = {"model": os.path.basename(M)}
p = start(DISK)
try:
    # Calibrate words -> tokens on text no later request shares.
    _, t = post(words(99, 2000), "x")
    per = t / 2000
    system = words(1, int(N / per))
    qs = [words(s, int(45 / per)) for s in (2, 3, 4, 5)]
    res["cold_s"], res["prompt_tokens"] = post(system, qs[0])
    k0 = kv()
    res["warm_s"], res["warm_phases_s"] = phases(post, system, qs[1])
    warm_reply = post.last
    # Again with other new tokens: the first warm request is the first to run a short tail after a long prefix.
    res["warm2_s"], res["warm2_phases_s"] = phases(post, system, qs[3])
    k1 = kv()
    res["warm_hit_tokens"] = k1["prefix_hit_tokens"] - k0["prefix_hit_tokens"]
    res["status_kv"] = k1
    # Let idle work write the pages to disk.
    last, stable, t0 = -1, 0, time.time()
    while stable < 3 and time.time() - t0 < 90:
        time.sleep(1)
        b = disk_bytes(); stable = stable + 1 if b == last else 0; last = b
    res["disk_bytes"] = last
finally:
    stop(p)
p = start(DISK)
try:
    k0 = kv()
    res["restart_disk_s"], res["restart_disk_phases_s"] = phases(post, system, qs[2])
    res["restart_disk_hit_tokens"] = kv()["prefix_hit_tokens"] - k0["prefix_hit_tokens"]
finally:
    stop(p)
p = start("0")
try:
    res["restart_recompute_s"], _ = post(system, qs[1])
    res["warm_reply_equals_recomputed"] = post.last == warm_reply
finally:
    stop(p)
res["warm_over_cold"] = res["warm_s"] / res["cold_s"]
res["restart_disk_over_cold"] = res["restart_disk_s"] / res["cold_s"]
print(json.dumps(res))
print(f"{res['model']}: prompt {res['prompt_tokens']} tokens; cold {res['cold_s']:.3f} s, warm {res['warm_s']:.3f} s "
      f"({100 * res['warm_over_cold']:.1f}%), after restart from disk {res['restart_disk_s']:.3f} s "
      f"({100 * res['restart_disk_over_cold']:.1f}%, {res['restart_disk_hit_tokens']} tokens from disk), after restart "
      f"recomputing {res['restart_recompute_s']:.3f} s (first token as the warm request's: {res['warm_reply_equals_recomputed']}); disk {res['disk_bytes'] / 1e9:.2f} GB; /status kv_cache "
      f"{json.dumps(res['status_kv'])}")
