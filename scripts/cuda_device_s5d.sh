#!/bin/bash
# Stretch-5 device run D: the engine's own decode loop (`splash run`, what `serve` uses) on CUDA, before and after
# the engine asks the runner for greedy argmaxes (Runner::forward_argmax) instead of copying logits.
set -u
R=$(pwd); NEW=${NEW:-$R/.dev/cuda/s5d/splash}; OLD=${OLD:-$R/.dev/cuda/s5/splash}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $S
$NEW synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
P="Write a Python function that parses a CSV file and returns the rows as dictionaries, with error handling."
gen() { timeout 120 $1 run -m /tmp/q15.gguf --device cuda --raw --temperature 0 --max-tokens 256 --spec-mode off \
  --stats -p "$P" 2>&1 >/dev/null | grep -E "decode_tok_s|rror|anic" | tail -3 | tee -a $S; }
for i in 1 2; do
  log "old engine (logits copied)"; gen $OLD
  log "new engine (argmax on the GPU)"; gen $NEW
done
log "new: splash bench tg for reference"
timeout 120 $NEW bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 2 2>&1 | grep -E "^(decode|prefill)" | tee -a $S
log done
