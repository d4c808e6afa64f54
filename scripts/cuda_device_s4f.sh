#!/bin/bash
# Stretch-4 device run F: Q8_0 / Q5_0 on the 8-bit-activation kernels (the 0.5B's layers and output matrix):
# cuda-check and decode of the 0.5B, with SPLASH_CUDA_Q8=0 for comparison; 1.5B decode as a control.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s4}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
tg() { M=${M:-q15}; timeout 150 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} --gen-tokens 128 \
  --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "check q05"; timeout 200 $B cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "q05 ctx 512"; M=q05 tg SPLASH_CUDA_Q8=1
log "q05 ctx 16"; M=q05 PT=16 tg SPLASH_CUDA_Q8=1
log "q05 ctx 512, f32 kernels"; M=q05 tg SPLASH_CUDA_Q8=0
log "q05 ctx 512"; M=q05 tg SPLASH_CUDA_Q8=1
log "q15 ctx 512"; tg SPLASH_CUDA_Q8=1
log done
