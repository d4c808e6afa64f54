#!/bin/bash
# Stretch-7 device run A: the attention and FFN RMSNorm + 8-bit quantization folded into the QKV and gate/up kernels'
# prologue (SPLASH_CUDA_FUSE_NORM, default on) and RoPE + the KV-cache write into the QKV kernel's epilogue
# (SPLASH_CUDA_QKV_ROPE, default on): 8 -> 5 launches per layer on the 1.5B. One binary; every variant's kernels are
# compiled first (in parallel), then cuda-check (new and both off: the same bits expected), then timed runs in
# alternation (after one warm-up), speculation on/off identity, then the 32B (RoPE fusion only: hidden 5120).
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s7}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
OFF="SPLASH_CUDA_FUSE_NORM=0 SPLASH_CUDA_QKV_ROPE=0"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1 &
SPID=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { M=$1; shift; timeout 240 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 \
  --repetitions 1 > $OUT/warm_${M}_$RANDOM.log 2>&1; }
log "smoke q15 (compile, new)"
warm q15 X=1; rc=$?; tail -3 $OUT/warm_q15_* | tee -a $S
if [ $rc -ne 0 ]; then log "failed (rc $rc): stopping"; exit 1; fi
log "compile variants"
warm q15 $OFF & warm q15 SPLASH_CUDA_FUSE_NORM=0 & warm q15 SPLASH_CUDA_QKV_ROPE=0 & warm q05 X=1 & warm q05 $OFF &
log "check q15 (new)"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
wait
log "check q15 (both off)"; timeout 200 env $OFF $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
log "check q05 (new)"; timeout 200 $B cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
log "check q05 (both off)"; timeout 200 env $OFF $B cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
grep -h -E "rror|anic" $OUT/warm_* | head -5 | tee -a $S
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "q15 warm-up"; REPS=1 tg X=1
for r in 1 2 3; do
  log "q15 ctx 512, fused (new) [$r]"; tg X=1
  log "q15 ctx 512, both off (stretch 6) [$r]"; tg $OFF
done
log "q15 ctx 512, norm fused only"; tg SPLASH_CUDA_QKV_ROPE=0
log "q15 ctx 512, rope fused only"; tg SPLASH_CUDA_FUSE_NORM=0
log "q15 ctx 16, new"; PT=16 tg X=1
log "q05 ctx 512, new"; M=q05 tg X=1
log "q05 ctx 512, both off"; M=q05 tg $OFF
log "spec on/off identity, q15 + q05 draft (new)"
timeout 150 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -vE "^\s*$" | tail -12 | tee -a $S
wait $SPID
log "compile q32 variants"
warm q32 X=1 & warm q32 $OFF &
wait
for r in 1 2; do
  log "q32 ctx 512, new (rope fused) [$r]"; M=q32 REPS=2 TO=200 tg X=1
  log "q32 ctx 512, both off [$r]"; M=q32 REPS=2 TO=200 tg $OFF
done
log done
