#!/bin/bash
# (The switch was removed after this call: the code is in commit 59ac629.)
# Stretch-10 device call B: the fused down projection with its last block reading the sums with plain L2 loads, and
# the cost of its adds (SPLASH_CUDA_GU_DOWN=2 leaves them out: timing only). Binary in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s10}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
warm() { SPLASH_CUDA_GU_DOWN=$2 timeout 240 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1_$2.log 2>&1; }
log "compile q15 with GU_DOWN 1, 2, 0"
warm q15 1 & warm q15 2 & warm q15 0 & wait
grep -h -E "rror|anic" $OUT/warm_* | head -4 | tee -a $S
log "check q15 (GU_DOWN on)"; timeout 150 $B cuda-check -m /tmp/q15.gguf -t 8 2>&1 | grep -E "decode|batched|rror" | tee -a $S
tg() { G=$1; M=$2; shift 2; echo "GU_DOWN=$G $M: $(SPLASH_CUDA_GU_DOWN=$G timeout 100 $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 "$@" 2>&1 | grep -E "^(decode|aggregate)|rror|anic" | tr '\n' ' ')" | tee -a $S; }
for r in 1 2; do tg 1 q15 --repetitions 3; tg 2 q15 --repetitions 3; tg 0 q15 --repetitions 3; done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for G in 1 2; do
  log "ncu gudq, GU_DOWN=$G"
  SPLASH_CUDA_GU_DOWN=$G timeout 100 $NCU --clock-control none --graph-profiling node -k regex:"^gudq" --launch-skip 56 --launch-count 56 --csv --metrics gpu__time_duration.sum \
    $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 3 --repetitions 1 > $OUT/ncu_b$G.csv 2>&1
  grep '"gpu__time_duration.sum"' $OUT/ncu_b$G.csv | awk -F'","' '{n=$5; sub(/\(.*/,"",n); t[n]+=$(NF); c[n]++} END{for(k in t) printf "%s %d launches %.2f us each\n", k, c[k], t[k]/c[k]/1000}' | tr -d '"' | tee -a $S
done
log done
