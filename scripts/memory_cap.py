#!/usr/bin/env python3
"""The server's memory under a bounded, varied load (issue 22): starts `splash serve` (default settings unless given
after `--`), sends PROMPTS distinct prompts of about TOKENS tokens each (a few at once), samples the process's RSS,
and compares its peak with what the memory plan allows: weights, margin and workspaces plus the KV pool (the planned
sequences' pages and the in-memory prefix cache's cap). Also the RSS once idle after the load: the running
sequences' blocks beyond the cap are evicted when they end, and their memory should leave the process. Prints one
JSON line; exits 1 if the peak RSS is over.

    scripts/memory_cap.py [--model smollm2-135m] [--prompts 200] [--tokens 1000] [--concurrency 2] [-- SERVE ARGS]
"""
import argparse, json, os, re, shutil, subprocess, sys, tempfile, threading, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="smollm2-135m")
ap.add_argument("--prompts", type=int, default=200)
ap.add_argument("--tokens", type=int, default=1000)
ap.add_argument("--concurrency", type=int, default=2)
ap.add_argument("--port", type=int, default=8931)
ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "splash"))
ap.add_argument("serve_args", nargs="*")
a = ap.parse_args()

# A fresh $SPLASH_HOME (the models linked in) so the disk tier starts empty: no earlier run's blocks are warm.
real_home = os.environ.get("SPLASH_HOME", os.path.expanduser("~/.cache/splash"))
home = tempfile.mkdtemp(prefix="splash-memory-cap-")
os.symlink(os.path.join(real_home, "models"), os.path.join(home, "models"))
cmd = [a.bin, "serve", "-m", a.model, "--port", str(a.port), "--no-webui"] + a.serve_args
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "SPLASH_HOME": home})
plan_line = []
def read_err():
    for line in proc.stderr:
        if line.startswith("plan:"):
            plan_line.append(line.strip())
threading.Thread(target=read_err, daemon=True).start()
assert proc.stdout.readline().startswith("Ready"), "the server did not start"
base = f"http://127.0.0.1:{a.port}"

def rss():
    with open(f"/proc/{proc.pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024

def get(path):
    return json.load(urllib.request.urlopen(base + path, timeout=60))

start_rss = rss()
peak = [start_rss]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.05)
threading.Thread(target=sample, daemon=True).start()

words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()
def prompt(i):
    # Distinct from the first token on: no two prompts share a cached block.
    return f"Request {i}. " + " ".join(f"{words[(i * 7 + j) % len(words)]}{(i * 31 + j) % 997}" for j in range(a.tokens // 3))

def worker(ids):
    for i in ids:
        body = json.dumps({"messages": [{"role": "user", "content": prompt(i)}], "max_tokens": 4}).encode()
        req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
        json.load(urllib.request.urlopen(req, timeout=600))

t0 = time.time()
threads = [threading.Thread(target=worker, args=(range(k, a.prompts, a.concurrency),)) for k in range(a.concurrency)]
for t in threads: t.start()
for t in threads: t.join()
time.sleep(1)
done.set()
seconds = time.time() - t0
time.sleep(2)
idle_rss = rss()
status = get("/status")
proc.terminate(); proc.wait(timeout=60)
disk_blocks = sum(len(files) for _, _, files in os.walk(os.path.join(home, "prefix-cache")))
shutil.rmtree(home)

plan = status["memory_plan"]
kv = status["kv_cache"]
page_bytes = plan["page_tokens"] * plan["kv_bytes_per_token"]
deducted = sum(i["bytes"] for i in plan["breakdown"]["items"] if not i["label"].startswith("safety margin"))
allowed = deducted + plan["num_kv_pages"] * page_bytes
gib = lambda b: round(b / 2**30, 3)
out = {
    "model": a.model, "serve_args": a.serve_args, "prompts": a.prompts, "seconds": round(seconds, 1),
    "prompt_tokens_total": kv["prefix_lookup_tokens"],
    "kv_tokens_if_all_kept_gib": gib(kv["prefix_lookup_tokens"] * plan["kv_bytes_per_token"]),
    "prefix_cache_cap_gib": gib((plan["max_cached_pages"] or 0) * page_bytes) if plan["max_cached_pages"] is not None else None,
    "kv_pool_gib": gib(plan["num_kv_pages"] * page_bytes),
    "plan_allows_gib (weights + workspaces + KV pool)": gib(allowed),
    "start_rss_gib": gib(start_rss), "peak_rss_gib": gib(peak[0]), "idle_rss_gib (3 s after the load)": gib(idle_rss),
    "cached_gib": gib(kv["cached_blocks"] * page_bytes),
    "cached_blocks": kv["cached_blocks"], "max_cached_blocks": kv["max_cached_blocks"],
    "stored_blocks_end": kv["stored_blocks"], "evicted_blocks": kv["evicted_blocks"], "disk_blocks_end": disk_blocks,
    "plan_line": plan_line[0] if plan_line else None,
}
print(json.dumps(out))
sys.exit(0 if peak[0] <= allowed else 1)
