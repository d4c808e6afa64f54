#!/bin/bash
# Stretch-5 device run E: the engine's decode loop (`splash run`) on CUDA with the runner's argmax on and off
# (SPLASH_RUNNER_ARGMAX), same binary, alternating; the stretch-5 helper binary as a control.
set -u
R=$(pwd); NEW=${NEW:-$R/.dev/cuda/s5d/splash}; OLD=${OLD:-$R/.dev/cuda/s5/splash}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
$NEW synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
P="Write a Python function that parses a CSV file and returns the rows as dictionaries, with error handling."
gen() { timeout 120 env $2 $1 run -m /tmp/q15.gguf --device cuda --raw --temperature 0 --max-tokens 256 --spec-mode off \
  --stats -p "$P" 2>&1 >/dev/null | grep -oE '"decode_tok_s":[0-9.]+|rror.*|anic.*' | tail -1 | tee -a $S; }
gen $NEW X=1 > /dev/null
for i in 1 2 3; do
  log "argmax on"; gen $NEW SPLASH_RUNNER_ARGMAX=1
  log "argmax off"; gen $NEW SPLASH_RUNNER_ARGMAX=0
  log "helper binary"; gen $OLD X=1
done
log done
