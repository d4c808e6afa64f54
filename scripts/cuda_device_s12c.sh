#!/bin/bash
# Stretch 12, call C: the 1.5B's gate/up kernel runs 280 blocks of 256 threads at 113 registers, 2 per
# multiprocessor: 264 at once and 16 in a second wave. SPLASH_CUDA_GU_MINB=3 bounds it to 3 per multiprocessor (80
# registers, ~110 bytes of spills per thread: one wave); SPLASH_CUDA_GU_SMEM=1 (stretch 7's up rows in shared
# memory, also 3 per multiprocessor) for comparison. Same sums, so cuda-check must be unchanged.
# (SPLASH_CUDA_GU_MINB lived in an uncommitted build: 5% slower, not kept; BENCHMARKS.md, stretch 12.)
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s12}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt; W=/tmp/s12w; mkdir -p $W
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
log "compile"
warm() { env $1 SPLASH_NVRTC_VERBOSE=1 timeout 240 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $W/warm_$2.log 2>&1; }
warm X=0 def & warm SPLASH_CUDA_GU_MINB=3 minb3 & warm SPLASH_CUDA_GU_SMEM=1 smem & wait
for v in def minb3 smem; do echo "$v: $(grep -A3 "entry function 'guq_12_1536_8_1'" $W/warm_$v.log | grep -E "Used|spill" | tr '\n' ' ')" | tee -a $S; done
grep -h -E "rror|anic" $W/warm_* | head -4 | tee -a $S
log "check q15, GU_MINB=3"
SPLASH_CUDA_GU_MINB=3 timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "^decode|batched|ahead|rror" | tee -a $S
b() { echo "$1 ctx=$2: $(env $1 timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens $2 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror" | tr '\n' ' ')" | tee -a $S; }
log "decode, alternated"
for r in 1 2 3; do for e in X=0 SPLASH_CUDA_GU_MINB=3 SPLASH_CUDA_GU_SMEM=1; do b $e 512; done; done
for e in X=0 SPLASH_CUDA_GU_MINB=3; do b $e 2048; done
log "aggregate"
for e in X=0 SPLASH_CUDA_GU_MINB=3; do echo "$e: $(env $e timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 1 --concurrent 16 --concurrent 64 2>&1 | grep -E "sequences" | tr '\n' ' ')" | tee -a $S; done
log done
