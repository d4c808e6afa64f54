#!/usr/bin/env bash
# Cold vs warm start of `splash serve`: seconds from launch until it prints `Ready` (it then accepts requests).
#   cold = first start after dropping the page cache (needs root: sync; echo 3 > /proc/sys/vm/drop_caches)
#   warm = the starts after it (files in the page cache)
# Usage: scripts/bench_start.sh [MODEL] [WARM_RUNS]   (MODEL default: the default pack, qwen2.5-coder-1.5b)
# Env: SPLASH (binary, default target/release/splash), PORT (default 18431). Prints one line per start and the
# serve's own timing line ("model ... loaded in X s"), and how long the first 1-token chat reply then takes.
set -euo pipefail
model="${1:-qwen2.5-coder-1.5b}"
warm_runs="${2:-3}"
bin="${SPLASH:-$(dirname "$0")/../target/release/splash}"
port="${PORT:-18431}"

start_once() {
  local label="$1" log
  log="$(mktemp)"
  local t0 t1
  t0=$(date +%s.%N)
  "$bin" serve --model "$model" --port "$port" >"$log.out" 2>"$log.err" &
  local pid=$!
  while ! grep -q '^Ready' "$log.out" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then echo "serve exited:"; cat "$log.err"; exit 1; fi
    sleep 0.01
  done
  t1=$(date +%s.%N)
  # Then one short chat request (1 output token): it touches every weight page, so a cold start pays its disk
  # reads here (the weights are memory-mapped, not read before Ready).
  curl -sf "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1}' >/dev/null
  t2=$(date +%s.%N)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  printf '%-5s %6.2f s until Ready, first 1-token reply %5.2f s later   (%s)\n' "$label" "$(echo "$t1 - $t0" | bc)" \
    "$(echo "$t2 - $t1" | bc)" "$(grep -o 'loaded in [0-9.]* s' "$log.err" || true)"
  rm -f "$log" "$log.out" "$log.err"
}

# Pages of a file that some other process maps (another server, a test) survive drop_caches, so the timed server
# reads a private copy of the cache (same bytes, mtimes kept so the hash stamps stay valid) that nobody else maps.
src_home="${SPLASH_HOME:-$HOME/.cache/splash}"
bench_home="${BENCH_HOME:-/tmp/splash-bench-home}"
"$bin" pull "$model" >/dev/null   # pulled and stamped in the real cache first
mkdir -p "$bench_home/models"
for f in "$src_home"/models/*.gguf "$src_home"/models/*.verified; do
  [ -e "$bench_home/models/$(basename "$f")" ] || cp -p "$f" "$bench_home/models/"
done
export SPLASH_HOME="$bench_home"
"$bin" pull "$model" >/dev/null   # finds the copies verified: no download
sync
if [ -w /proc/sys/vm/drop_caches ]; then
  echo 3 > /proc/sys/vm/drop_caches
  command -v fincore >/dev/null && fincore "$bench_home"/models/*.gguf | sed 's/^/  page cache before the cold start: /'
  start_once cold
else
  echo "(not root: cannot drop the page cache; no cold start)"
fi
for _ in $(seq "$warm_runs"); do start_once warm; done
