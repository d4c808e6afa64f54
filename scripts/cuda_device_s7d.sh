#!/bin/bash
# Stretch-7 device run D: run C showed fewer attention splits (8 or 16 warps per block) slower; here the other way:
# attention blocks of 2 or 1 warps (SPLASH_CUDA_ATT_WARPS; splits of at least 64 / 32 positions, so more blocks per
# head) against 4 (default). cuda-check of each, timed runs in alternation at context 512, 2048 and 16, speculation
# identity and aggregate decode with the best.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s7}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { M=$1; shift; timeout 240 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 \
  --repetitions 1 > $OUT/warm_${M}_$RANDOM.log 2>&1; }
log "compile q15 ATT_WARPS 1 / 2 / 4, q05 2 / 4"
warm q15 SPLASH_CUDA_ATT_WARPS=1 & warm q15 SPLASH_CUDA_ATT_WARPS=2 & warm q15 SPLASH_CUDA_ATT_WARPS=4 &
warm q05 SPLASH_CUDA_ATT_WARPS=2 & warm q05 SPLASH_CUDA_ATT_WARPS=4 & wait
grep -h -E "rror|anic" $OUT/warm_* | head -6 | tee -a $S
for w in 1 2; do
  log "check q15 (ATT_WARPS=$w)"; timeout 200 env SPLASH_CUDA_ATT_WARPS=$w $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
done
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "q15 warm-up"; REPS=1 tg SPLASH_CUDA_ATT_WARPS=4
for r in 1 2 3; do
  for w in 4 2 1; do log "q15 ctx 512, ATT_WARPS=$w [$r]"; tg SPLASH_CUDA_ATT_WARPS=$w; done
done
for w in 4 2 1; do log "q15 ctx 2048, ATT_WARPS=$w"; PT=2048 tg SPLASH_CUDA_ATT_WARPS=$w; done
for w in 4 2 1; do log "q15 ctx 16, ATT_WARPS=$w"; PT=16 tg SPLASH_CUDA_ATT_WARPS=$w; done
for w in 4 2; do log "q05 ctx 512, ATT_WARPS=$w"; M=q05 tg SPLASH_CUDA_ATT_WARPS=$w; done
log "spec on/off identity, q15 + q05 draft (ATT_WARPS=2)"
SPLASH_CUDA_ATT_WARPS=2 timeout 150 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -o "identical [a-z]*" | sort | uniq -c | tee -a $S
log done
