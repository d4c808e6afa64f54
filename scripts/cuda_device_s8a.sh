#!/bin/bash
# Stretch-8 device run A: gate/up with the gate and up pairs taken together so their shared activations are loaded
# once (SPLASH_CUDA_GU_DOT2=1), and the Q6_K down / output matrices' 8-bit input in a layout of their own
# (SPLASH_CUDA_X6=1: each of a warp's four activation loads per pair reads 512 contiguous bytes instead of 8 lines).
# One binary; every variant's kernels compiled first (in parallel); cuda-check of the new kernels (same figures
# expected: same sums); then timed runs alternated after one warm-up; speculation identity; then the 32B.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s8ca}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
ALL="SPLASH_CUDA_GU_DOT2=1 SPLASH_CUDA_X6=1"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1 &
SPID=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { M=$1; shift; timeout 240 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 \
  --repetitions 1 > $OUT/warm_${M}_$RANDOM.log 2>&1; }
log "compile q15 x4, q05 x2"
P=""
for v in "q15 X=1" "q15 $ALL" "q15 SPLASH_CUDA_GU_DOT2=1" "q15 SPLASH_CUDA_X6=1" "q05 X=1" "q05 $ALL"; do
  warm $v & P="$P $!"
done
wait $P
grep -h -E "rror|anic|load" $OUT/warm_* | head -8 | tee -a $S
( wait $SPID; warm q32 X=1 & warm q32 $ALL & warm q32 SPLASH_CUDA_GU_DOT2=1 & warm q32 SPLASH_CUDA_X6=1 & wait ) &
CPID=$!
log "check q15 (GU_DOT2 + X6)"; timeout 200 env $ALL $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
log "check q05 (GU_DOT2 + X6)"; timeout 200 env $ALL $B cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode)|rror|anic" | tee -a $S; }
log "q15 warm-up"; REPS=1 tg X=1
for r in 1 2 3; do
  log "q15 ctx 512, default [$r]"; tg X=1
  log "q15 ctx 512, DOT2+X6 [$r]"; tg $ALL
  log "q15 ctx 512, DOT2 [$r]"; tg SPLASH_CUDA_GU_DOT2=1
  log "q15 ctx 512, X6 [$r]"; tg SPLASH_CUDA_X6=1
done
log "q15 ctx 16, default"; PT=16 tg X=1
log "q15 ctx 16, DOT2+X6"; PT=16 tg $ALL
for r in 1 2; do
  log "q05 ctx 512, default [$r]"; M=q05 tg X=1
  log "q05 ctx 512, DOT2+X6 [$r]"; M=q05 tg $ALL
done
log "spec on/off identity, q15 + q05 draft (DOT2+X6)"
timeout 150 env $ALL $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -E "identical|rror" | tee -a $S
wait $CPID
log "q32 compiled"; grep -h -E "rror|anic" $OUT/warm_q32* | head -3 | tee -a $S
for v in "X=1" "$ALL" "SPLASH_CUDA_GU_DOT2=1" "SPLASH_CUDA_X6=1" "X=1" "$ALL"; do
  log "q32 ctx 512, $v"; M=q32 REPS=2 TO=200 tg $v
done
log done
