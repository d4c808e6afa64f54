#!/bin/bash
# The GPU prefix-cache call: cuda-check, then the prefix test (prefix.py) on the synthetic 1.5B and 32B. D holds
# splash.xz (default .dev/cc); OUT gets summary3.txt and the servers' logs.
set -u
R=$(pwd); D=${D:-$R/.dev/cc}; C=$R/benchmarks/core-cuda; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=/tmp/sh; mkdir -p $SPLASH_HOME
S=$OUT/summary3.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
xz -dc $D/splash.xz > /tmp/new; chmod +x /tmp/new
log synth
/tmp/new synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
(/tmp/new synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1; timeout 200 /tmp/new bench -m /tmp/q32.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm32.log 2>&1) &
SP=$!
log "check q15"; timeout 150 /tmp/new cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "prefix q15"; rm -rf $SPLASH_HOME/prefix-cache; timeout 200 python3 $C/prefix.py /tmp/new /tmp/q15.gguf 8311 8G 2>&1 | tail -2 | tee -a $S
wait $SP; grep -E "rror|anic" $OUT/warm32.log | tee -a $S
log "prefix q32"; rm -rf $SPLASH_HOME/prefix-cache; timeout 280 python3 $C/prefix.py /tmp/new /tmp/q32.gguf 8312 16G 2>&1 | tail -2 | tee -a $S
cp /tmp/serve_*.log $OUT/ 2>/dev/null
log done
