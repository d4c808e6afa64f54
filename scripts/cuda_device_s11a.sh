#!/bin/bash
# Stretch-11 device call A: the next kernels' weights prefetched into L2 by the kernel before them
# (SPLASH_CUDA_L2PF bit mask: 1 attention -> wo, gate, up; 2 down -> next layer's q, k, v; 4 gate/up -> down;
# SPLASH_CUDA_L2PF_MODE 1 per-line prefetch, 2 bulk). Correctness (cuda-check, speculation identity) with it on,
# then decode on the 1.5B and 0.5B with each setting, alternated, in the same call. Binary in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s11}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
B=$D/splash
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { timeout 240 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1.log 2>&1; }
log "compile"
warm q15 & warm q05 & wait
grep -h -E "rror|anic" $OUT/warm_* | head -4 | tee -a $S
export SPLASH_CUDA_L2PF=7 SPLASH_CUDA_L2PF_MODE=1
for M in q15 q05; do
  log "check $M (L2PF 7)"; timeout 150 $B cuda-check -m /tmp/$M.gguf -t 8 2>&1 | grep -E "vs cpu|batched|device|rror" | tee -a $S
done
log "spec, q15 + q05 draft (L2PF 7)"
timeout 120 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -E "identical|rror" | awk '{print $1, $2, $4, $5, $13, $14}' | tr '\n' ';' | tee -a $S; echo | tee -a $S
unset SPLASH_CUDA_L2PF SPLASH_CUDA_L2PF_MODE
tg() { L=$1; M=$2; shift 2; echo "$L $M: $(timeout 100 $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 "$@" 2>&1 | grep -E "^(decode|aggregate)|steps|rror|anic" | tr '\n' ' ')" | tee -a $S; }
v() { SPLASH_CUDA_L2PF=$1 SPLASH_CUDA_L2PF_MODE=$2 tg "pf=$1 mode=$2" $3 --repetitions 3; }
log "decode @ 512, 1.5B, alternated"
for r in 1 2; do for c in "0 1" "1 1" "1 2" "3 1" "3 2" "5 1" "7 1" "7 2"; do v $c q15; done; done
log "decode @ 512, 0.5B"
for r in 1 2; do for c in "0 1" "1 1" "3 1" "7 1" "7 2"; do v $c q05; done; done
log "aggregate q15"; SPLASH_CUDA_L2PF=3 tg "pf=3" q15 --repetitions 1 --concurrent 16 --concurrent 64; tg "pf=0" q15 --repetitions 1 --concurrent 16 --concurrent 64
log done
