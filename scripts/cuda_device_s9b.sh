#!/bin/bash
# Stretch-9 device call B: the price of selecting the largest logits on the device (runner level: `bench
# --candidates N` against the argmax), and engine decode with top-k sampling before (the stretch-8 binary in $OLD,
# whole rows copied back, sampled on the host) and after (this binary in $D). Also re-checks the device selection
# (cuda-check) after the copy-back change.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s9}; B=$D/splash; OLD=${OLD:-$R/.dev/cuda/s8f/splash}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { timeout 240 $1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$3_$2.log 2>&1; }
log "compile q15, q05, new and old binaries"
warm $B q15 new & warm $B q05 new & warm $OLD q15 old & warm $OLD q05 old & wait
grep -h -E "rror|anic|compil" $OUT/warm_* | head -6 | tee -a $S
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "device|FAIL|PASS" | tee -a $S
for r in 1 2; do
  for c in 0 20 84 256; do
    echo "q15 ctx 512, candidates $c [$r]: $(timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 --candidates $c 2>&1 | grep -E '^decode|rror')" | tee -a $S
  done
done
P="Write a Python function that parses a CSV file and returns the rows as dictionaries, with error handling."
gen() { # binary label model, then splash run args
  local BIN=$1 L=$2 M=$3; shift 3
  timeout 60 $BIN run -m /tmp/$M.gguf --device cuda --raw -p "$P" --max-tokens 384 --seed 7 --stats --spec-mode off "$@" \
    > $OUT/gen_${M}_${L}.txt 2> $OUT/gen_${M}_${L}.err
  echo "$M $L: $(grep -o '"decode_tok_s":[0-9.]*' $OUT/gen_${M}_${L}.err) $(grep -o '"generated_tokens":[0-9]*' $OUT/gen_${M}_${L}.err) text md5 $(md5sum < $OUT/gen_${M}_${L}.txt | cut -c1-12) $(grep -h -E 'rror|anic' $OUT/gen_${M}_${L}.err | head -2)" | tee -a $S
}
SAMPLED="--temperature 0.7 --top-k 20 --top-p 0.8 --repeat-penalty 1.05"
for M in q15 q05; do
  log "engine decode $M: greedy and sampled (pack defaults), old binary then new, three rounds"
  for r in 1 2 3; do
    gen $OLD old_greedy$r $M --temperature 0
    gen $B new_greedy$r $M --temperature 0
    gen $OLD old_sampled$r $M $SAMPLED
    gen $B new_sampled$r $M $SAMPLED
  done
done
log done
