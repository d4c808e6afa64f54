#!/bin/bash
# Stretch-6 device run E (lead): main after the merge (HEAD: the helper's kernels, the forward_argmax pass-through,
# guided drafting off on CUDA) against the call-C binary (same kernels, logits copied back every greedy step), alternating,
# on the 1.5B and the 32B; cuda-check of the 1.5B; speculation on/off identity on the GPU with the 0.5B draft.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s6}; B=$D/splash; BC=$D/splash_c; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1 &
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
log "check q15 (HEAD; compiles)"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "vs|rror|compiled" | tee -a $S
tg() { M=${M:-q15}; timeout ${TO:-150} ${BIN:-$B} bench -m /tmp/$M.gguf --device cuda --prompt-tokens 512 \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "q15 warm-up"; REPS=1 tg
for r in 1 2; do
  log "q15 ctx 512, HEAD [$r]"; tg
  log "q15 ctx 512, call-C binary [$r]"; BIN=$BC tg
done
log "spec on/off identity, q15 + q05 draft (HEAD)"
timeout 150 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -vE "^\s*$" | tail -12 | tee -a $S
wait
log "q32 ctx 512, HEAD (compiles)"; M=q32 REPS=2 TO=240 tg
log "q32 ctx 512, call-C binary"; BIN=$BC M=q32 REPS=2 TO=200 tg
log "q32 ctx 512, HEAD"; M=q32 REPS=2 TO=200 tg
log done
