#!/bin/bash
# Stretch-12 final device run: scripts/cuda_device_s8final.sh (side by side with a fresh llama.cpp build in the same
# call) on this stretch's binary, then the attention kernel and its output projection with programmatic dependent
# launch inside the graphs off (SPLASH_CUDA_GRAPH_PDL_ATT=0) against the default, alternated, on the 1.5B, 0.5B and 32B
# files it wrote, and aggregate decode with it off; then the gate/up kernel with it too (SPLASH_CUDA_GRAPH_PDL_K=guq).
# Usage: D=$PWD/.dev/cuda/s12 bash scripts/cuda_device_s12final.sh   (carry .dev/cuda/s12 and .dev/cuda/llama.tar.xz)
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s12}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
D=$D bash $R/scripts/cuda_device_s8final.sh
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
v() { echo "pdl_att=$1 $2: $(SPLASH_CUDA_GRAPH_PDL_ATT=$1 timeout 100 $B bench -m /tmp/$2.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions $3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
log "attention + output projection with PDL in graphs: default (1) vs off (0), alternated"
for r in 1 2; do v 1 q15 3; v 0 q15 3; done
v 1 q05 3; v 0 q05 3
v 1 q32 2; v 0 q32 2
log "also the gate/up kernel with PDL in graphs (SPLASH_CUDA_GRAPH_PDL_K=guq) vs default, alternated"
g() { echo "pdl_k=$1 $2: $(SPLASH_CUDA_GRAPH_PDL_K=$1 timeout 100 $B bench -m /tmp/$2.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
for r in 1 2; do g guq q15; g , q15; done
g guq q05; g , q05
log "aggregate, PDL for attention off"
SPLASH_CUDA_GRAPH_PDL_ATT=0 timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 1 --concurrent 16 --concurrent 64 2>&1 | grep -E "sequences" | tee -a $S
log "final done"
