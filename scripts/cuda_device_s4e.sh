#!/bin/bash
# Stretch-4 device run E: thread split per weight row, SPLASH_CUDA_Q8_IT=1 against 3 (alternating, 1.5B), with and
# without programmatic dependent launch in graphs, and on the 32B. Needs $D holding `splash`.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s4}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
(mkdir -p /tmp/s && $B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > /tmp/s/q32.log 2>&1) &
SP=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
tg() { M=${M:-q15}; timeout 150 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} --gen-tokens 128 \
  --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "q15 it=1 (compiles)"; tg SPLASH_CUDA_Q8_IT=1
log "q15 it=3 (compiles)"; tg SPLASH_CUDA_Q8_IT=3
for r in 1 2; do
  log "q15 it=1"; tg SPLASH_CUDA_Q8_IT=1
  log "q15 it=3"; tg SPLASH_CUDA_Q8_IT=3
done
log "q15 it=1 + pdl in graphs"; tg SPLASH_CUDA_Q8_IT=1 SPLASH_CUDA_GRAPH_PDL=1
log "check q15 it=1"; SPLASH_CUDA_Q8_IT=1 timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "decode|batched" | tee -a $S
wait $SP; tail -1 /tmp/s/q32.log | tee -a $S
log "q32 it=1 (compiles)"; M=q32 REPS=2 tg SPLASH_CUDA_Q8_IT=1
log done
