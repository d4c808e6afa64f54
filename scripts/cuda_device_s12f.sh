#!/bin/bash
# Stretch 12, call F: programmatic dependent launch inside the decode graphs for chosen kernels only
# (SPLASH_CUDA_GRAPH_PDL_K): the attention kernel's start (metadata, page-table lookups, K/V prefetch into L2) and
# the output projection's weight loads then overlap the kernel before them. All kernels (SPLASH_CUDA_GRAPH_PDL=1) was
# 1% slower in stretch 10. Same arithmetic, so cuda-check must be unchanged.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s12}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
timeout 240 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > /dev/null 2>&1 &
timeout 240 $B bench -m /tmp/q05.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > /dev/null 2>&1 &
wait
b() { echo "$2 k=$1: $(env SPLASH_CUDA_GRAPH_PDL_K=$1 $3 timeout 100 $B bench -m /tmp/$2.gguf --device cuda --prompt-tokens ${4:-512} --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror" | tr '\n' ' ')" | tee -a $S; }
log "decode @ 512, alternated"
for r in 1 2; do for k in , attention attention,mmvq_12_1536 attention,mmvq qkvq,attention,mmvq; do b $k q15 X=0; done; b , q15 SPLASH_CUDA_GRAPH_PDL=1; done
for r in 1 2; do for k in , attention attention,mmvq; do b $k q05 X=0; done; done
log "ctx 2048 (the 16-split launch)"
for k in , attention attention,mmvq; do b $k q15 X=0 2048; done
log "check q15 with attention,mmvq"
SPLASH_CUDA_GRAPH_PDL_K=attention,mmvq timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "^decode|batched|ahead|pick on|rror" | tee -a $S
log done
