#!/bin/bash
# Stretch-10 device call E: threads per row of the 8-bit kernels for the 1.5B's small matrices
# (SPLASH_CUDA_Q8_IT_SMALL, pairs per thread: 3 by default; 4 and 5 give the down projection 32 threads per row
# instead of 64, 6 also gives gate/up 4 instead of 8), decode at ctx 512 alternated, with cuda-check for each.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s10}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
warm() { SPLASH_CUDA_Q8_IT_SMALL=$1 timeout 240 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1.log 2>&1; }
log "compile"
warm 3 & warm 4 & warm 5 & warm 6 & wait
grep -h -E "rror|anic" $OUT/warm_* | head -4 | tee -a $S
for I in 4 5 6; do
  log "check IT_SMALL=$I"; SPLASH_CUDA_Q8_IT_SMALL=$I timeout 150 $B cuda-check -m /tmp/q15.gguf -t 8 2>&1 | grep -E "decode \(|batched" | tee -a $S
done
tg() { echo "IT_SMALL=$1: $(SPLASH_CUDA_Q8_IT_SMALL=$1 timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
for r in 1 2 3; do for I in 3 4 5 6; do tg $I; done; done
log done
