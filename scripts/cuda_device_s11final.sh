#!/bin/bash
# Stretch-11 final device run: scripts/cuda_device_s8final.sh (side by side with a fresh llama.cpp build in the same
# call) on this stretch's binary, then batch-1 decode with clustered attention off (SPLASH_CUDA_ATT_CL=0) against
# the default, alternated, on the 1.5B, 0.5B and 32B files it wrote.
# Usage: D=$PWD/.dev/cuda/s11 bash scripts/cuda_device_s11final.sh   (carry .dev/cuda/s11 and .dev/cuda/llama.tar.xz)
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s11}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
D=$D bash $R/scripts/cuda_device_s8final.sh
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
v() { echo "cl=$1 $2: $(SPLASH_CUDA_ATT_CL=$1 timeout 100 $B bench -m /tmp/$2.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions $3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
log "clustered attention off (0) vs default (8), alternated"
for r in 1 2; do v 8 q15 3; v 0 q15 3; done
v 8 q05 3; v 0 q05 3
v 8 q32 2; v 0 q32 2
log "final done"
