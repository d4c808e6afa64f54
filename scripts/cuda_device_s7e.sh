#!/bin/bash
# Stretch-7 device run E: the greedy pick's probability on the GPU (`forward_top`: argmax_rows' second pass), so
# `top_prob_is_cheap` is true on CUDA and confidence-guided drafting runs there. cuda-check (the new line: device
# probability vs models::top_prob of the copied logits), speculation identity with guided drafting (default) and
# without (--no-draft-confidence, the stretch-6 behaviour on CUDA), plain decode unchanged.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s7}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { M=$1; shift; timeout 240 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 \
  --repetitions 1 > $OUT/warm_${M}_$RANDOM.log 2>&1; }
log "compile q15, q05"
warm q15 X=1 & warm q05 X=1 & wait
grep -h -E "rror|anic" $OUT/warm_* | head -6 | tee -a $S
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "check q05"; timeout 200 $B cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
for r in 1 2; do
  log "spec, q15 + q05 draft, guided (default) [$r]"
  timeout 150 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -vE "^\s*$" | tail -12 | tee -a $S
  log "spec, q15 + q05 draft, --no-draft-confidence [$r]"
  timeout 150 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 --no-draft-confidence 2>&1 | grep -vE "^\s*$" | tail -12 | tee -a $S
done
log "q15 ctx 512"; timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror" | tee -a $S
log done
