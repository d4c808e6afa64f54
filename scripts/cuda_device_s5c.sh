#!/bin/bash
# Stretch-5 device run C: same binary as run B. 32B decode against the stretch-4 binary on the same machine, with
# programmatic dependent launch inside the graphs, and with 4 pairs per thread; 1.5B aggregate decode (16 and 64
# sequences).
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s5}; B=$D/splash; B4=$R/.dev/cuda/s4/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1 &
SPID=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" ${BIN:-$B} bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} $EXTRA 2>&1 | grep -E "^(decode|prefill|aggregate)|concurr|rror|anic|compiled" | tee -a $S; }
EXTRA=""
log "q15 ctx 512, 16 and 64 sequences"; EXTRA="--concurrent 16 --concurrent 64" tg X=1
wait $SPID
log "q32 ctx 512"; M=q32 REPS=2 TO=200 tg X=1
log "q32 ctx 512, graph pdl"; M=q32 REPS=2 TO=200 tg SPLASH_CUDA_GRAPH_PDL=1
log "q32 ctx 512, stretch-4 binary"; BIN=$B4 M=q32 REPS=2 TO=200 tg X=1
log "q32 ctx 512"; M=q32 REPS=2 TO=200 tg X=1
log "q32 ctx 512, 4 pairs per thread"; M=q32 REPS=2 TO=200 tg SPLASH_CUDA_Q8_IT=4
log done
