#!/bin/bash
# Stretch-10 device call H: programmatic dependent launch inside the CUDA graphs (SPLASH_CUDA_GRAPH_PDL=1; same kernels,
# the same bits) and attention blocks of 8 warps (SPLASH_CUDA_ATT_WARPS=8), against the defaults, on main's binary;
# decode at ctx 512 alternated. Binary in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s10}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
timeout 200 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > /dev/null 2>&1 &
SPLASH_CUDA_ATT_WARPS=8 timeout 200 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > /dev/null 2>&1 &
wait
tg() { L=$1; shift; echo "$L: $(env "$@" timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
for r in 1 2 3; do tg default X=1; tg graph_pdl SPLASH_CUDA_GRAPH_PDL=1; tg att_warps8 SPLASH_CUDA_ATT_WARPS=8; done
