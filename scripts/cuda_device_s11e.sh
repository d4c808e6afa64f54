#!/bin/bash
# Stretch-11 device call E: up to how many rows clustered attention pays. Aggregate decode at 2, 4, 8 and 16
# sequences (ctx 512) with SPLASH_CUDA_ATT_CL=0 and with 8 at any row count (SPLASH_CUDA_ATT_CL_ROWS=16), alternated;
# speculative decoding's speed (its verification passes are k + 1 rows) with the default against 0.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s11}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
B=$D/splash
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
log "compile"
for c in 0 8; do SPLASH_CUDA_ATT_CL=$c timeout 240 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > /dev/null 2>&1 & done; wait
tg() { L=$1; M=$2; shift 2; echo "$L $M: $(timeout 100 $B bench -m /tmp/$M.gguf --device cuda --gen-tokens 128 "$@" 2>&1 | grep -E "^(aggregate)|sequences|rror|anic" | sed 's/decode *//' | tr '\n' ' ')" | tee -a $S; }
log "aggregate, alternated"
for r in 1 2; do
  SPLASH_CUDA_ATT_CL=0 tg "cl=0" q15 --prompt-tokens 512 --repetitions 1 --concurrent 2 --concurrent 4 --concurrent 8 --concurrent 16
  SPLASH_CUDA_ATT_CL=8 SPLASH_CUDA_ATT_CL_ROWS=16 tg "cl=8 rows<=16" q15 --prompt-tokens 512 --repetitions 1 --concurrent 2 --concurrent 4 --concurrent 8 --concurrent 16
done
log "speculation speed (draft q05), default vs ATT_CL=0"
for c in 8 0; do echo "cl=$c: $(SPLASH_CUDA_ATT_CL=$c timeout 120 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -E "^(draft|auto) code" | cut -c1-150 | tr '\n' ';')" | tee -a $S; done
log done
