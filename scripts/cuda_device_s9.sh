#!/bin/bash
# Stretch-9 device call: top-k sampling from the largest logits selected on the GPU (`topk_rows`,
# Runner::forward_candidates). Checks that the device's selection equals the host's (cuda-check), that a seeded
# sampled reply is the same text with and without it (SPLASH_SAMPLE_CANDIDATES=0: whole rows copied back and sampled
# on the host), and measures engine decode speed greedy and sampled (the packs' defaults: temperature 0.7, top-k 20,
# top-p 0.8, repetition penalty 1.05). The binary is carried in $D (default .dev/cuda/s9).
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s9}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { M=$1; timeout 240 $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 \
  > $OUT/warm_$M.log 2>&1; }
log "compile q15, q05"
warm q15 & warm q05 & wait
grep -h -E "rror|anic|compil" $OUT/warm_* | head -6 | tee -a $S
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
P="Write a Python function that parses a CSV file and returns the rows as dictionaries, with error handling."
gen() { # model, label, env..., then splash run args
  local M=$1 L=$2; shift 2
  env "$@" timeout 60 $B run -m /tmp/$M.gguf --device cuda --raw -p "$P" --max-tokens 384 --seed 7 --stats \
    --spec-mode off $GEN_ARGS > $OUT/gen_${M}_${L}.txt 2> $OUT/gen_${M}_${L}.err
  echo "$M $L: $(grep -o '"decode_tok_s":[0-9.]*' $OUT/gen_${M}_${L}.err) tokens $(grep -o '"generated_tokens":[0-9]*' $OUT/gen_${M}_${L}.err) text md5 $(md5sum < $OUT/gen_${M}_${L}.txt | cut -c1-12) $(grep -h -E 'rror|anic' $OUT/gen_${M}_${L}.err | head -2)" | tee -a $S
}
for M in q15 q05; do
  log "engine decode $M: greedy, then sampled (pack defaults) with and without device candidates, twice"
  GEN_ARGS="--temperature 0"; gen $M greedy
  for r in 1 2; do
    GEN_ARGS="--temperature 0.7 --top-k 20 --top-p 0.8 --repeat-penalty 1.05"
    gen $M cand$r
    gen $M whole$r SPLASH_SAMPLE_CANDIDATES=0
    gen $M hostsel$r SPLASH_CUDA_CANDIDATES=0
  done
done
log "q15 bench ctx 512 (runner greedy, unchanged path)"
timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror" | tee -a $S
log done
