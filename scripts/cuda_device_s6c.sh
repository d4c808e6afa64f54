#!/bin/bash
# Stretch-6 device run C (same kernels as run B plus SPLASH_CUDA_Q8_IT_SMALL): pairs per thread for the small
# matrices (under 64M values: QKV, attention output, the 1.5B's FFN) at 1 and 2 against the default 3, and
# programmatic dependent launch inside the graphs, on the 1.5B and the 32B; cuda-check of the 1.5B with the two
# other splits; 1.5B aggregate decode (16 and 64 sequences).
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s6}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1 &
SPID=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
warm() { M=$1; shift; timeout 240 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 \
  --repetitions 1 > $OUT/warm_${M}_$RANDOM.log 2>&1; }
log "compile q15 variants"
warm q15 X=1 & warm q15 SPLASH_CUDA_Q8_IT_SMALL=1 & warm q15 SPLASH_CUDA_Q8_IT_SMALL=2 &
wait
grep -h -E "rror|anic" $OUT/warm_* | head -5 | tee -a $S
log "check q15 with 1 and 2 pairs per thread (small matrices), in the background"
(timeout 200 env SPLASH_CUDA_Q8_IT_SMALL=1 $B cuda-check -m /tmp/q15.gguf -t 8 2>&1 | grep -E "vs|rror" > $OUT/check_it1.txt) &
(timeout 200 env SPLASH_CUDA_Q8_IT_SMALL=2 $B cuda-check -m /tmp/q15.gguf -t 8 2>&1 | grep -E "vs|rror" > $OUT/check_it2.txt) &
wait $SPID
log "compile q32 variants"
warm q32 X=1 & warm q32 SPLASH_CUDA_Q8_IT_SMALL=1 & warm q32 SPLASH_CUDA_Q8_IT_SMALL=2 &
wait
log "check, 1 pair"; cat $OUT/check_it1.txt | tee -a $S
log "check, 2 pairs"; cat $OUT/check_it2.txt | tee -a $S
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} $EXTRA 2>&1 | grep -E "^(decode|prefill|aggregate)|concurr|rror|anic|compiled" | tee -a $S; }
EXTRA=""
log "q15 warm-up"; REPS=1 tg X=1
for r in 1 2; do
  log "q15 ctx 512 [$r]"; tg X=1
  log "q15 ctx 512, small IT 1 [$r]"; tg SPLASH_CUDA_Q8_IT_SMALL=1
  log "q15 ctx 512, small IT 2 [$r]"; tg SPLASH_CUDA_Q8_IT_SMALL=2
  log "q15 ctx 512, graph pdl [$r]"; tg SPLASH_CUDA_GRAPH_PDL=1
done
log "q15 ctx 512, 16 and 64 sequences"; EXTRA="--concurrent 16 --concurrent 64" tg X=1
EXTRA=""
log "q32 ctx 512"; M=q32 REPS=2 TO=200 tg X=1
log "q32 ctx 512, small IT 1"; M=q32 REPS=2 TO=200 tg SPLASH_CUDA_Q8_IT_SMALL=1
log "q32 ctx 512, small IT 2"; M=q32 REPS=2 TO=200 tg SPLASH_CUDA_Q8_IT_SMALL=2
log "q32 ctx 512, graph pdl"; M=q32 REPS=2 TO=200 tg SPLASH_CUDA_GRAPH_PDL=1
log done
