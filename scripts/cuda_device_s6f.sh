#!/bin/bash
# Stretch-6 device run F (lead): `splash serve --device cuda` sizes the GPU KV pool from its memory plan (free device
# memory by cuMemGetInfo), target and draft; a chat completion through it; `splash plan --device cuda` for comparison.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s6}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
log "plan --device cuda"; $B plan --device cuda -m /tmp/q15.gguf --draft /tmp/q05.gguf 2>&1 | head -30 | tee -a $S
log "serve --device cuda"
$B serve --device cuda -m /tmp/q15.gguf --draft /tmp/q05.gguf --port 8000 > $OUT/serve.log 2>&1 &
for i in $(seq 1 240); do curl -s localhost:8000/v1/models > /dev/null 2>&1 && break; sleep 1; done
log "serve up after ${i}s"; grep -E "^plan|^cuda|KV|loaded|Ready|speculation" $OUT/serve.log | tee -a $S
curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \
  -d '{"messages":[{"role":"user","content":"Say hi"}],"max_tokens":16,"temperature":0}' | head -c 600 | tee -a $S; echo | tee -a $S
curl -s localhost:8000/status | head -c 1500 | tee -a $S; echo | tee -a $S
kill %1; wait
log done
