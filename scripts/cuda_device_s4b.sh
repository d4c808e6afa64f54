#!/bin/bash
# Stretch-4 device run B: quantization kernel over many blocks, 8-bit output fused into attention and gate/up,
# K/V prefetch in attention, Q6_K dequant fix. cuda-check, decode with and without programmatic dependent launch
# inside graphs (SPLASH_CUDA_GRAPH_PDL), per-kernel profile, SPLASH_CUDA_Q8_IT=2. Needs $D holding `splash`.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s4}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
log synth
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
tg() { timeout 120 env "$@" $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 \
  --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "check q15 (first start compiles)"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | tee -a $S
log "q8"; tg SPLASH_CUDA_Q8=1
log "q8 + pdl in graphs"; tg SPLASH_CUDA_GRAPH_PDL=1
log "q8"; tg SPLASH_CUDA_Q8=1
for sk in guq_ _8960_ mmvq_14_1536 mmvq_12_1536 qkvq_ quant_q8 attention rope_kv; do
  log "skip $sk"; REPS=1 tg SPLASH_CUDA_PROFILE_SKIP=$sk
done
log "skip attention,rope_kv + pdl in graphs"; REPS=1 tg SPLASH_CUDA_PROFILE_SKIP=attention,rope_kv SPLASH_CUDA_GRAPH_PDL=1
log "q8 it=2"; tg SPLASH_CUDA_Q8_IT=2
log "q8 it=2 + pdl in graphs"; tg SPLASH_CUDA_Q8_IT=2 SPLASH_CUDA_GRAPH_PDL=1
log done
