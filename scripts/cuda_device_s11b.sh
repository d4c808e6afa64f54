#!/bin/bash
# Stretch-11 device call B: decode attention's splits as one thread-block cluster, merged through distributed shared
# memory (SPLASH_CUDA_ATT_CL = 8 or 16) against the global-memory merge with a counter (0). Correctness first
# (cuda-check, speculation identity), then decode on the 1.5B and 0.5B at contexts 512 and 2048, alternated.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s11}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
B=$D/splash
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { SPLASH_CUDA_ATT_CL=$2 timeout 240 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1_$2.log 2>&1; }
log "compile"
for c in 0 8 16; do warm q15 $c & warm q05 $c & done; wait
grep -h -E "rror|anic" $OUT/warm_* | head -4 | tee -a $S
for c in 8 16; do for M in q15 q05; do
  log "check $M (ATT_CL $c)"; SPLASH_CUDA_ATT_CL=$c timeout 150 $B cuda-check -m /tmp/$M.gguf -t 8 2>&1 | grep -E "vs cpu|batched|device|rror" | tee -a $S
done; done
log "spec, q15 + q05 draft (ATT_CL 16)"
SPLASH_CUDA_ATT_CL=16 timeout 120 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -E "identical|rror" | awk '{print $1, $2, $4, $5, $13, $14}' | tr '\n' ';' | tee -a $S; echo | tee -a $S
tg() { L=$1; M=$2; shift 2; echo "$L $M: $(timeout 100 $B bench -m /tmp/$M.gguf --device cuda --gen-tokens 128 "$@" 2>&1 | grep -E "^(decode|aggregate)|steps|rror|anic" | tr '\n' ' ')" | tee -a $S; }
v() { SPLASH_CUDA_ATT_CL=$1 tg "cl=$1 ctx=$3" $2 --prompt-tokens $3 --repetitions 3; }
log "decode, alternated"
for r in 1 2 3; do for c in 0 8 16; do v $c q15 512; done; done
for r in 1 2; do for c in 0 8 16; do v $c q15 2048; done; done
for r in 1 2; do for c in 0 8 16; do v $c q05 512; done; done
log "aggregate q15"; for c in 0 16; do SPLASH_CUDA_ATT_CL=$c tg "cl=$c" q15 --prompt-tokens 512 --repetitions 1 --concurrent 16 --concurrent 64; done
log done
