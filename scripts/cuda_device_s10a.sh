#!/bin/bash
# (The switch was removed after this call: the code is in commit 59ac629.)
# Stretch-10 device call A: the down projection fused into the gate/up kernel (`SPLASH_CUDA_GU_DOWN`, fixed-point
# partial sums). Checks it against the CPU (cuda-check on the 1.5B and 0.5B, speculation identity), then decode speed
# with it on and off alternated in the same call (ctx 512; aggregate 16 and 64 sequences) and the kernels of one
# decode step (ncu, cold caches). Binary in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s10}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { SPLASH_CUDA_GU_DOWN=$2 timeout 240 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1_$2.log 2>&1; }
log "compile q15, q05 with and without GU_DOWN"
warm q15 1 & warm q05 1 & warm q15 0 & warm q05 0 & wait
grep -H -E "rror|anic|^model" $OUT/warm_* | head -8 | tee -a $S
for M in q15 q05; do
  log "check $M (GU_DOWN on)"; timeout 150 $B cuda-check -m /tmp/$M.gguf -t 8 > $OUT/check_$M.txt 2>&1; grep -v "^$" $OUT/check_$M.txt | tee -a $S
done
log "check q15 GU_DOWN=0"; SPLASH_CUDA_GU_DOWN=0 timeout 150 $B cuda-check -m /tmp/q15.gguf -t 8 > $OUT/check_q15_off.txt 2>&1; grep -v "^$" $OUT/check_q15_off.txt | tee -a $S
log "spec, q15 + q05 draft"
timeout 120 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -vE "^\s*$" | tail -12 | tee -a $S
tg() { G=$1; M=$2; shift 2; echo "GU_DOWN=$G $M: $(SPLASH_CUDA_GU_DOWN=$G timeout 100 $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 "$@" 2>&1 | grep -E "^(decode|aggregate)|rror|anic" | tr '\n' ' ')" | tee -a $S; }
log "decode @ 512, alternated"
for r in 1 2 3; do tg 1 q15 --repetitions 3; tg 0 q15 --repetitions 3; done
for r in 1 2; do tg 1 q05 --repetitions 3; tg 0 q05 --repetitions 3; done
log "aggregate q15 16 and 64 sequences"
tg 1 q15 --repetitions 1 --concurrent 16 --concurrent 64; tg 0 q15 --repetitions 1 --concurrent 16 --concurrent 64
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for G in 1 0; do
  log "ncu every kernel of a decode step, q15, GU_DOWN=$G"
  SPLASH_CUDA_GU_DOWN=$G timeout 200 $NCU --clock-control none --graph-profiling node --csv --metrics gpu__time_duration.sum \
    $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 3 --repetitions 1 > $OUT/ncu_$G.csv 2>&1
  grep '"gpu__time_duration.sum"' $OUT/ncu_$G.csv | awk -F'","' '{n=$5; sub(/\(.*/,"",n); print n "\t" $(NF)}' | tr -d '",' > $OUT/ncu_seq_$G.tsv
  awk -F'\t' '/^argmax_rows/{last2=last1; last1=NR} {a[NR]=$0} END{for(i=last2+1;i<=last1;i++) print a[i]}' $OUT/ncu_seq_$G.tsv \
    | awk -F'\t' '{t[$1]+=$2; c[$1]++; T+=$2} END{for(k in t) printf "%-40s %4d launches %9.1f us\n", k, c[k], t[k]/1000; printf "total %.1f us\n", T/1000}' \
    | sort -k4 -n -r | tee -a $S
done
log done
