#!/bin/bash
# (The switch was removed after this call and never committed; BENCHMARKS.md stretch 10 describes the change.)
# Stretch-10 device call G: the attention kernel's query loaded before the page-table lookup of its K/V prefetch
# (SPLASH_CUDA_ATT_EARLY_Q, default on; the same bits). cuda-check with it on, decode alternated on/off. Binary in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s10}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { SPLASH_CUDA_ATT_EARLY_Q=$2 timeout 240 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1_$2.log 2>&1; }
log "compile"
warm q15 1 & warm q15 0 & warm q05 1 & warm q05 0 & wait
grep -h -E "rror|anic" $OUT/warm_* | head -4 | tee -a $S
log "check q15"; timeout 150 $B cuda-check -m /tmp/q15.gguf -t 8 2>&1 | grep -E "vs cpu|batched|device|rror" | tee -a $S
tg() { echo "EARLY_Q=$1 $2 $3: $(SPLASH_CUDA_ATT_EARLY_Q=$1 timeout 100 $B bench -m /tmp/$2.gguf --device cuda --prompt-tokens $3 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
for r in 1 2 3 4; do tg 1 q15 512; tg 0 q15 512; done
for r in 1 2; do tg 1 q15 2048; tg 0 q15 2048; tg 1 q05 512; tg 0 q05 512; done
log done
