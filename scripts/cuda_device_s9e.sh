#!/bin/bash
# Stretch-9 device call E: topk_rows without a merge on the device (each block's segment list, ranked instead of
# sorted; the host merges the 8 lists). Re-checks the device selection (cuda-check), times topk_rows (ncu) and every
# kernel of one 1.5B decode step (ncu, cold caches), measures runner decode with the argmax and with 84/256 candidates,
# and engine decode greedy and sampled (the packs' defaults). Binary in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s9}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { timeout 240 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1.log 2>&1; }
log "compile q15, q05"
warm q15 & warm q05 & wait
grep -h -E "rror|anic|compil" $OUT/warm_* | head -6 | tee -a $S
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "device|FAIL|PASS|rror|anic" | tee -a $S
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
log "ncu topk_rows"
timeout 120 $NCU --clock-control none --graph-profiling node -k regex:"^topk_rows" --launch-skip 4 --launch-count 3 \
  --csv --metrics gpu__time_duration.sum $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 8 \
  --repetitions 1 --candidates 84 > $OUT/ncu_topk.csv 2>&1
grep -E '"topk_rows' $OUT/ncu_topk.csv | awk -F'","' '{print $5, $(NF)}' | tee -a $S
log "ncu every kernel of a decode run (q15, 16-token prompt, 3 steps)"
timeout 240 $NCU --clock-control none --graph-profiling node --csv --metrics gpu__time_duration.sum \
  $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 3 --repetitions 1 > $OUT/ncu_all.csv 2>&1
grep -c '"gpu__time_duration.sum"' $OUT/ncu_all.csv | tee -a $S
# The last step's kernels: everything after the last-but-one argmax_rows.
grep '"gpu__time_duration.sum"' $OUT/ncu_all.csv | awk -F'","' '{n=$5; sub(/\(.*/,"",n); print n "\t" $(NF)}' | tr -d '",' > $OUT/ncu_seq.tsv
awk -F'\t' '/^argmax_rows/{last2=last1; last1=NR} {a[NR]=$0} END{for(i=last2+1;i<=last1;i++) print a[i]}' $OUT/ncu_seq.tsv \
  | awk -F'\t' '{t[$1]+=$2; c[$1]++; T+=$2} END{for(k in t) printf "%-40s %4d launches %9.1f us\n", k, c[k], t[k]/1000; printf "total %.1f us\n", T/1000}' \
  | sort -k4 -n -r | tee -a $S
for r in 1 2; do
  for c in 0 84 256; do
    echo "q15 ctx 512, candidates $c [$r]: $(timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 --candidates $c 2>&1 | grep -E '^decode|rror')" | tee -a $S
  done
done
P="Write a Python function that parses a CSV file and returns the rows as dictionaries, with error handling."
gen() { # label model, then splash run args
  local L=$1 M=$2; shift 2
  timeout 60 $B run -m /tmp/$M.gguf --device cuda --raw -p "$P" --max-tokens 384 --seed 7 --stats --spec-mode off "$@" \
    > $OUT/gen_${M}_${L}.txt 2> $OUT/gen_${M}_${L}.err
  echo "$M $L: $(grep -o '"decode_tok_s":[0-9.]*' $OUT/gen_${M}_${L}.err) $(grep -o '"generated_tokens":[0-9]*' $OUT/gen_${M}_${L}.err) text md5 $(md5sum < $OUT/gen_${M}_${L}.txt | cut -c1-12) $(grep -h -E 'rror|anic' $OUT/gen_${M}_${L}.err | head -2)" | tee -a $S
}
SAMPLED="--temperature 0.7 --top-k 20 --top-p 0.8 --repeat-penalty 1.05"
for M in q15 q05; do
  log "engine decode $M: greedy and sampled (pack defaults), two rounds"
  for r in 1 2; do
    gen greedy$r $M --temperature 0
    gen sampled$r $M $SAMPLED
  done
done
log done
