#!/bin/bash
# Stretch-7 device run F (lead): main after merging s7-cuda and the CPU-side draft-head change, as a check that the
# merged binary still compiles its kernels, matches the CPU (cuda-check), keeps speculation's output identical on the
# GPU, and decodes at the call-E speed. The binary is carried in .dev/cuda/s7f.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s7f}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { M=$1; timeout 240 $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 \
  > $OUT/warm_$M.log 2>&1; }
log "compile q15, q05"
warm q15 & warm q05 & wait
grep -h -E "rror|anic|compil" $OUT/warm_* | head -6 | tee -a $S
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "spec, q15 + q05 draft"
timeout 150 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -vE "^\s*$" | tail -12 | tee -a $S
for r in 1 2; do
  log "q15 ctx 512 [$r]"; timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror" | tee -a $S
done
log done
