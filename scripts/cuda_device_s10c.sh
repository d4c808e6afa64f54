#!/bin/bash
# Stretch-10 device call C: a pass's metadata in one page-locked copy (was five pageable copies). Checks it against
# the CPU (cuda-check on the 1.5B and 0.5B, speculation identity), splits a decode step (SPLASH_CUDA_TIME_STEPS=1)
# and times decode against the previous binary ($D/splash0, run with SPLASH_CUDA_GU_DOWN=0: main's code path), in
# the same call, alternated. Then, for the next stretch, what each kernel family really costs inside the graph:
# decode with it left out (SPLASH_CUDA_PROFILE_SKIP; results wrong, timing only). Binaries in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s10}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
export SPLASH_CUDA_GU_DOWN=0
B=$D/splash; B0=$D/splash0
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { timeout 240 $1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$2_$3.log 2>&1; }
log "compile"
warm $B q15 new & warm $B q05 new & warm $B0 q15 old & warm $B0 q05 old & wait
grep -h -E "rror|anic" $OUT/warm_* | head -4 | tee -a $S
for M in q15 q05; do
  log "check $M"; timeout 150 $B cuda-check -m /tmp/$M.gguf -t 8 2>&1 | grep -E "vs cpu|batched|device|rror" | tee -a $S
done
log "spec, q15 + q05 draft"
timeout 120 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -E "identical|rror" | awk '{print $1, $2, $4, $5, $13, $14}' | tr '\n' ';' | tee -a $S; echo | tee -a $S
tg() { L=$1; X=$2; M=$3; shift 3; echo "$L $M: $(timeout 100 $X bench -m /tmp/$M.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 "$@" 2>&1 | grep -E "^(decode|aggregate)|steps|rror|anic" | tr '\n' ' ')" | tee -a $S; }
log "step split"
SPLASH_CUDA_TIME_STEPS=1 tg new $B q15 --repetitions 3; SPLASH_CUDA_TIME_STEPS=1 tg old $B0 q15 --repetitions 3
log "decode @ 512, alternated"
for r in 1 2 3; do tg new $B q15 --repetitions 3; tg old $B0 q15 --repetitions 3; done
for r in 1 2; do tg new $B q05 --repetitions 3; tg old $B0 q05 --repetitions 3; done
tg new $B q15 --repetitions 3 --candidates 84; tg old $B0 q15 --repetitions 3 --candidates 84
log "aggregate q15"; tg new $B q15 --repetitions 1 --concurrent 16 --concurrent 64
log "decode with a kernel family left out (timing only)"
for K in attention qkvq mmvq_12_1536 guq mmvq_12_8960,mmvq_14_8960 mmvq_14_1536; do
  SPLASH_CUDA_PROFILE_SKIP=$K tg "skip $K" $B q15 --repetitions 3
done
log done
