#!/bin/bash
# Stretch 12, call E: what the pass's ends cost inside the graph at 512 (decode with a kernel left out,
# SPLASH_CUDA_PROFILE_SKIP; wrong results, timing only; ahead off, since the ring is written by argmax_rows).
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s12}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
b() { echo "skip=$1: $(SPLASH_CUDA_AHEAD=0 SPLASH_CUDA_PROFILE_SKIP=$1 timeout 240 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror" | tr '\n' ' ')" | tee -a $S; }
log "decode @ 512, ahead off, one kernel family left out"
for r in 1 2; do for k in none argmax_rows quant_q8 embed mmvq_14_1536 attention; do b $k; done; done
log done
