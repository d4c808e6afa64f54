#!/bin/bash
# (The switch was removed after this call and never committed; BENCHMARKS.md stretch 10 describes the change.)
# Stretch-10 device call D: the attention kernel's query-key dot as four partial sums (SPLASH_CUDA_ATT_ILP, default
# on). cuda-check and speculation identity with it on, then decode at ctx 512 and 2048 alternated: on, off (this
# binary) and the previous main ($D/splash0 with SPLASH_CUDA_GU_DOWN=0). Binaries in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s10}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
export SPLASH_CUDA_GU_DOWN=0
B=$D/splash; B0=$D/splash0
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { SPLASH_CUDA_ATT_ILP=$4 timeout 240 $1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$2_$3.log 2>&1; }
log "compile"
warm $B q15 ilp 1 & warm $B q05 ilp 1 & warm $B q15 noilp 0 & warm $B q05 noilp 0 & warm $B0 q15 old 1 & warm $B0 q05 old 1 & wait
grep -h -E "rror|anic" $OUT/warm_* | head -4 | tee -a $S
for M in q15 q05; do
  log "check $M"; timeout 150 $B cuda-check -m /tmp/$M.gguf -t 8 2>&1 | grep -E "vs cpu|batched|device|rror" | tee -a $S
done
log "spec, q15 + q05 draft"
timeout 120 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -E "identical|rror" | awk '{print $1, $2, $4, $5, $13, $14}' | tr '\n' ';' | tee -a $S; echo | tee -a $S
tg() { L=$1; X=$2; I=$3; M=$4; shift 4; echo "$L $M $*: $(SPLASH_CUDA_ATT_ILP=$I timeout 100 $X bench -m /tmp/$M.gguf --device cuda --gen-tokens 128 "$@" 2>&1 | grep -E "^(decode|aggregate)|rror|anic" | tr '\n' ' ')" | tee -a $S; }
log "decode alternated"
for P in 512 2048; do
  for r in 1 2 3; do tg ilp $B 1 q15 --prompt-tokens $P --repetitions 3; tg noilp $B 0 q15 --prompt-tokens $P --repetitions 3; tg old $B0 1 q15 --prompt-tokens $P --repetitions 3; done
done
for r in 1 2; do tg ilp $B 1 q05 --prompt-tokens 512 --repetitions 3; tg noilp $B 0 q05 --prompt-tokens 512 --repetitions 3; tg old $B0 1 q05 --prompt-tokens 512 --repetitions 3; done
log "skip attention (timing only)"; SPLASH_CUDA_PROFILE_SKIP=attention tg ilp $B 1 q15 --prompt-tokens 512 --repetitions 3
log done
