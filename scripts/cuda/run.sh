#!/bin/bash
# The CUDA backend's device runner: every GPU call (checks, side by side with llama.cpp, A/B of a switch) is one
# invocation of this script with its arguments; an experiment is a switch here and a dated entry in benchmarks/log/.
#
# On the build machine:
#   scripts/cuda/run.sh build NAME     cargo build --release, strip -o .dev/cuda/NAME/splash, pack llama.cpp's source
#                                      (scripts/cuda/llama_tar.sh) unless .dev/cuda/llama.tar.xz exists; prints what to
#                                      carry (.dev/cuda/NAME and .dev/cuda/llama.tar.xz)
# On the GPU machine (no internet; the repository root is the working directory):
#   D=$PWD/.dev/cuda/NAME scripts/cuda/run.sh [OPTIONS] [STEP...]
#
# Steps (default: side-by-side = synth warm check spec side pp aggregate; llama.cpp builds in the background from the
# start whenever a step needs it, and the timed runs wait for that build, so they share the machine with nothing):
#   synth      synthetic GGUF files with the shapes of --models (q05, q15, q32 = Qwen2.5-Coder 0.5B / 1.5B / 32B, q30a =
#              Qwen3-30B-A3B, the MoE; all Q4_K_M)
#   warm       first start of every model at once (NVRTC compiles), then a second start of the first (kernel cache)
#   check      splash cuda-check (CUDA against the CPU, batched against unbatched) on each model but the 32B
#   spec       speculation identity: bench --spec on q15 with q05 as the draft
#   side       batch-1 decode at each --contexts: splash twice around llama-bench tg128 -d CTX
#   pp         prefill of --pp-tokens tokens (every model but q05): splash against llama-bench's best setting (-b 4096 -ub 2048)
#   aggregate  decode of 16 and 64 concurrent sequences (q15)
#   ab         A/B of each --ab switch: decode at each --contexts on each --models, the values alternated --rounds times
#   ab-aggregate  the same A/B for aggregate decode (q15)
#   ab-text    greedy text of `splash run --spec-mode off` with each --ab value, compared byte for byte
#   ab-check   cuda-check with each --ab value
#
# Options:
#   --models LIST       models, comma-separated (default q15,q05,q32)
#   --contexts LIST     decode contexts (default 512)
#   --ab VAR=V1,V2,...  a switch and its values, e.g. SPLASH_CUDA_GRAPH_PDL_ATT=1,0 (repeatable; an empty value unsets)
#   --rounds N          alternations per A/B (default 2)
#   --reps N            repetitions per splash bench (default 3; 2 for q32)
#   --pp-tokens N       prefill length (default 4096)
#   --check-positions N cuda-check positions (default 256)
#   --no-llama          no llama.cpp build and no llama.cpp figures
#   --dry-run           print every command instead of running it
#
# Environment: D (the folder holding the stripped splash binary; default .dev/cuda/current), OUT (logs and summary.txt;
# default ./cuda-out), LLAMA_TAR (default .dev/cuda/llama.tar.xz), BUILD_S (seconds to wait for llama.cpp's build;
# default 380), SPLASH_HOME (default /tmp/splash-home), FILES (where the synthetic files go; default /tmp).
#
# The last side-by-side table of BENCHMARKS.md (stretch 12's final call) is
#   D=$PWD/.dev/cuda/NAME scripts/cuda/run.sh side-by-side ab ab-aggregate --ab SPLASH_CUDA_GRAPH_PDL_ATT=1,0
set -u
R=$(pwd)
MODELS=q15,q05,q32; CONTEXTS=512; ROUNDS=2; REPS=3; PP=4096; POSITIONS=256; LLAMA=1; DRY=0; AB=(); STEPS=()
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case $1 in
    --models) MODELS=$2; shift ;;
    --contexts) CONTEXTS=$2; shift ;;
    --ab) AB+=("$2"); shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --reps) REPS=$2; shift ;;
    --pp-tokens) PP=$2; shift ;;
    --check-positions) POSITIONS=$2; shift ;;
    --no-llama) LLAMA=0 ;;
    --dry-run) DRY=1 ;;
    -h|--help) usage ;;
    -*) echo "unknown option $1" >&2; usage 2 >&2 ;;
    *) STEPS+=("$1") ;;
  esac
  shift
done
[ ${#STEPS[@]} -eq 0 ] && STEPS=(side-by-side)

# Every command goes through x: run it, or with --dry-run print it (on stderr, so no filter after it hides it), with
# the switch that `with` set for it.
x() {
  if [ $DRY = 1 ]; then { printf '+%s' "${WITH:+ $WITH}"; printf ' %q' "$@"; echo; } >&3; else "$@"; fi
}
exec 3>&2

if [ "${STEPS[0]}" = build ]; then
  NAME=${STEPS[1]:-}
  if [ -z "$NAME" ] || [ ${#STEPS[@]} -ne 2 ]; then echo "usage: scripts/cuda/run.sh build NAME" >&2; exit 2; fi
  x cargo build --release -p splash-cli || exit 1
  x mkdir -p ".dev/cuda/$NAME"
  x strip -o ".dev/cuda/$NAME/splash" target/release/splash || exit 1
  [ -f .dev/cuda/llama.tar.xz ] || x bash scripts/cuda/llama_tar.sh || exit 1
  echo "carry .dev/cuda/$NAME and .dev/cuda/llama.tar.xz; there: D=\$PWD/.dev/cuda/$NAME scripts/cuda/run.sh [STEP...]"
  exit 0
fi
EXPANDED=()
for s in "${STEPS[@]}"; do
  case $s in
    side-by-side) EXPANDED+=(synth warm check spec side pp aggregate) ;;
    synth|warm|check|spec|side|pp|aggregate|ab|ab-aggregate|ab-text|ab-check) EXPANDED+=("$s") ;;
    *) echo "unknown step $s" >&2; usage 2 >&2 ;;
  esac
done
IFS=, read -r -a MODEL_LIST <<< "$MODELS"
IFS=, read -r -a CONTEXT_LIST <<< "$CONTEXTS"
for m in "${MODEL_LIST[@]}"; do
  case $m in q05|q15|q32|q30a) ;; *) echo "unknown model $m (q05, q15, q32, q30a)" >&2; exit 2 ;; esac
done
for a in "${AB[@]}"; do
  case $a in SPLASH_*=*) ;; *) echo "--ab wants SPLASH_VAR=V1,V2, got $a" >&2; exit 2 ;; esac
done
case " ${EXPANDED[*]} " in *" ab"*) [ ${#AB[@]} -gt 0 ] || { echo "the ab steps need --ab VAR=V1,V2" >&2; exit 2; } ;; esac

LIKE() {
  case $1 in q05) echo qwen2.5-coder-0.5b ;; q15) echo qwen2.5-coder-1.5b ;; q32) echo qwen2.5-coder-32b ;; q30a) echo qwen3-30b-a3b ;; esac
}

D=${D:-$R/.dev/cuda/current}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; F=${FILES:-/tmp}
LLAMA_TAR=${LLAMA_TAR:-$R/.dev/cuda/llama.tar.xz}; BUILD_S=${BUILD_S:-380}
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}
if [ $DRY = 1 ]; then OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT; fi  # a dry run writes nothing of its own
S=$OUT/summary.txt; L=/tmp/l/llama.cpp/b/bin/llama-bench; LPID=
mkdir -p "$OUT"
[ $DRY = 1 ] || { mkdir -p "$SPLASH_HOME"; [ -x "$B" ] || { echo "no splash binary at $B (set D)" >&2; exit 2; }; }
log() { echo "== [$SECONDS s] $*" | tee -a "$S"; }
reps() { if [ "$1" = q32 ] && [ "$REPS" -gt 2 ]; then echo 2; else echo "$REPS"; fi; }
batch() { BATCH=(); if [ "$1" -gt 512 ]; then BATCH=(--batch 4096); fi; }  # longer prompts in one 4096 batch
# one line per call: the decode (or prefill / aggregate) figures splash bench printed
bench() { x timeout 200 "$B" bench --device cuda "$@" 2>&1 | grep -E "^(decode|prefill|aggregate)|sequences|rror|anic"; }
with() { # with VAR=VALUE CMD...: CMD (a function or a program) with VAR set; an empty VALUE unsets it
  local kv=$1; shift
  (
    if [ -n "${kv#*=}" ]; then export "${kv?}"; else unset "${kv%%=*}"; fi
    WITH=$kv; "$@"
  )
}

NEEDS_LLAMA=0
case " ${EXPANDED[*]} " in *" side "*|*" pp "*) NEEDS_LLAMA=$LLAMA ;; esac
[ $DRY = 1 ] || nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a "$S"
if [ "$NEEDS_LLAMA" = 1 ]; then
  # llama.cpp as llama-cpp-python 0.3.36 vendors it (scripts/cuda/llama_tar.sh), built for sm_90a in the background
  build_llama() {
    mkdir -p /tmp/l && cd /tmp/l && tar xJf "$LLAMA_TAR" && cd llama.cpp &&
      cmake -S . -B b -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release && cmake --build b --target llama-bench -j 14
  }
  if [ $DRY = 1 ]; then
    echo "+ (background) build llama-bench from $LLAMA_TAR into /tmp/l (cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a)" >&2
  else
    [ -f "$LLAMA_TAR" ] || { echo "no llama.cpp source at $LLAMA_TAR (scripts/cuda/llama_tar.sh; or --no-llama)" >&2; exit 2; }
    (build_llama) > "$OUT/llama_build.log" 2>&1 &
    LPID=$!
  fi
fi
llama_ready() { # wait for the background build (at most BUILD_S s from the start); true when llama-bench is there
  [ "$NEEDS_LLAMA" = 1 ] || return 1
  if [ -n "$LPID" ]; then
    while kill -0 "$LPID" 2>/dev/null && [ $SECONDS -lt "$BUILD_S" ]; do sleep 5; done
    if kill -0 "$LPID" 2>/dev/null; then
      log "llama.cpp build not done in $BUILD_S s; giving up on it"; kill "$LPID"; tail -3 "$OUT/llama_build.log" | tee -a "$S"
    elif [ -x $L ]; then log "llama.cpp built: $(tail -1 "$OUT/llama_build.log")"; fi
    LPID=
  fi
  [ $DRY = 1 ] || [ -x $L ]
}
llama() { x timeout 120 $L "$@" 2>&1 | grep "^|" | tee -a "$S"; }

step_synth() {
  log synth
  for m in "${MODEL_LIST[@]}"; do
    [ -f "$F/$m.gguf" ] || x "$B" synth --like "$(LIKE "$m")" -o "$F/$m.gguf" 2>&1 | tail -1 | tee -a "$S"
  done
}
step_warm() {
  log "compile ${MODEL_LIST[*]} (first start, together)"
  for m in "${MODEL_LIST[@]}"; do
    x timeout 240 "$B" bench -m "$F/$m.gguf" --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 \
      > "$OUT/warm_$m.log" 2>&1 &
  done
  wait
  [ $DRY = 1 ] || grep -H -E "rror|anic|^model" "$OUT"/warm_*.log | tee -a "$S"
  m=${MODEL_LIST[0]}; log "second start $m (kernel cache)"
  x timeout 240 "$B" bench -m "$F/$m.gguf" --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 2>&1 \
    | grep -E "rror|^model" | tee -a "$S"
}
check() { x timeout 200 "$B" cuda-check -m "$F/$1.gguf" -t 16 --positions "$POSITIONS" 2>&1 | grep -v "^$" | tee -a "$S"; }
step_check() {
  for m in "${MODEL_LIST[@]}"; do [ "$m" = q32 ] || { log "check $m"; check "$m"; }; done
}
step_spec() {
  log "spec, q15 with the q05 draft (every mode must be identical to plain decoding)"
  x timeout 120 "$B" bench -m "$F/q15.gguf" --device cuda --spec --draft "$F/q05.gguf" --gen-tokens 96 2>&1 \
    | grep -vE "^\s*$" | tail -12 | tee -a "$S"
}
step_side() {
  local have=0; llama_ready && have=1
  for m in "${MODEL_LIST[@]}"; do
    for c in "${CONTEXT_LIST[@]}"; do
      batch "$c"
      log "splash $m tg128 @ $c [1]"; bench -m "$F/$m.gguf" --prompt-tokens "$c" "${BATCH[@]}" --gen-tokens 128 \
        --repetitions "$(reps "$m")" | tee -a "$S"
      [ $have = 1 ] && { log "llama-bench $m tg128 @ d$c"; llama -m "$F/$m.gguf" -ngl 99 -fa 1 -p 0 -n 128 -d "$c" -r 3; }
      log "splash $m tg128 @ $c [2]"; bench -m "$F/$m.gguf" --prompt-tokens "$c" "${BATCH[@]}" --gen-tokens 128 \
        --repetitions "$(reps "$m")" | tee -a "$S"
    done
  done
}
step_pp() {
  local have=0; llama_ready && have=1
  for m in "${MODEL_LIST[@]}"; do
    [ "$m" = q05 ] && continue
    log "splash $m pp$PP"
    bench -m "$F/$m.gguf" --prompt-tokens "$PP" --batch 4096 --gen-tokens 0 --repetitions 3 | tee -a "$S"
    [ $have = 1 ] && { log "llama-bench $m pp$PP (best: -b 4096 -ub 2048)"
      llama -m "$F/$m.gguf" -ngl 99 -fa 1 -p "$PP" -n 0 -b 4096 -ub 2048 -r 2; }
  done
}
aggregate() { bench -m "$F/q15.gguf" --prompt-tokens 512 --gen-tokens 128 --repetitions 1 --concurrent 16 --concurrent 64; }
step_aggregate() { log "splash q15 aggregate 16 and 64 sequences"; aggregate | tee -a "$S"; }
values() { local v=${1#*=}; IFS=, read -r -a VALS <<< "$v,"; }  # "A=1,0" -> VALS=(1 0); "A=x," keeps the empty value
step_ab() {
  for a in "${AB[@]}"; do
    local var=${a%%=*}; values "$a"
    log "A/B $var over ${VALS[*]}, alternated, $ROUNDS rounds: decode @ ${CONTEXT_LIST[*]} on ${MODEL_LIST[*]}"
    for m in "${MODEL_LIST[@]}"; do for c in "${CONTEXT_LIST[@]}"; do
      for ((r = 0; r < ROUNDS; r++)); do for v in "${VALS[@]}"; do
        batch "$c"
        echo "$var=$v $m ctx=$c: $(with "$var=$v" bench -m "$F/$m.gguf" --prompt-tokens "$c" "${BATCH[@]}" \
          --gen-tokens 128 --repetitions "$(reps "$m")" | tr '\n' ' ')" | tee -a "$S"
      done; done
    done; done
  done
}
step_ab_aggregate() {
  for a in "${AB[@]}"; do
    local var=${a%%=*}; values "$a"
    log "A/B $var over ${VALS[*]}: aggregate decode, q15"
    for v in "${VALS[@]}"; do
      echo "$var=$v aggregate: $(with "$var=$v" aggregate | tr '\n' ' ')" | tee -a "$S"
    done
  done
}
step_ab_text() {
  local W=$OUT/text; x mkdir -p "$W"
  for a in "${AB[@]}"; do
    local var=${a%%=*}; values "$a"
    log "A/B $var over ${VALS[*]}: greedy text (splash run --spec-mode off, 200 tokens) must be identical"
    for p in 3 110; do
      PR=$(for ((i = 1; i <= p; i++)); do printf 'fn f%d(x: u32) -> u32 { x + %d } ' $i $i; done)
      for v in "${VALS[@]}"; do
        with "$var=$v" x timeout 120 "$B" run -m "$F/q15.gguf" --device cuda --raw -p "$PR" --max-tokens 200 \
          --temperature 0 --spec-mode off > "$W/run_${v:-unset}_$p.txt" 2> "$W/run_${v:-unset}_$p.err"
      done
      [ $DRY = 1 ] && continue
      local first=$W/run_${VALS[0]:-unset}_$p.txt same=identical
      for v in "${VALS[@]}"; do cmp -s "$first" "$W/run_${v:-unset}_$p.txt" || same=DIFFERENT; done
      echo "prompt of $p functions: $same, $(wc -c < "$first") bytes" | tee -a "$S"
    done
  done
}
step_ab_check() {
  for a in "${AB[@]}"; do
    local var=${a%%=*}; values "$a"
    for v in "${VALS[@]}"; do
      log "check q15 with $var=$v"
      with "$var=$v" x timeout 200 "$B" cuda-check -m "$F/q15.gguf" -t 16 --positions "$POSITIONS" 2>&1 \
        | grep -E "^(decode|prefill)|batched|ahead|pick on|rror" | tee -a "$S"
    done
  done
}

for s in "${EXPANDED[@]}"; do "step_${s//-/_}"; done
[ -n "$LPID" ] && kill "$LPID" 2>/dev/null
log "done"
