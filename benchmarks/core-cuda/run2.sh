#!/bin/bash
# core-cuda device call 2: the GPU prefix cache (16K prefix + ~50 new tokens): cold, warm, after restart (disk tier),
# after restart recomputing; /status's kv_cache. Needs call 1's /tmp files (a warm machine).
set -u
R=$(pwd); C=$R/.dev/cc; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=/tmp/sh; mkdir -p $SPLASH_HOME
S=$OUT/summary2.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -x /tmp/new ] || { xz -dc $C/splash.xz > /tmp/new; chmod +x /tmp/new; }
[ -f /tmp/q15.gguf ] || /tmp/new synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
log "prefix q15"; rm -rf $SPLASH_HOME/prefix-cache; timeout 250 python3 $C/prefix.py /tmp/new /tmp/q15.gguf 8311 8G 2>&1 | tee -a $S
[ -f /tmp/q32.gguf ] && { log "prefix q32"; rm -rf $SPLASH_HOME/prefix-cache; timeout 300 python3 $C/prefix.py /tmp/new /tmp/q32.gguf 8312 16G 2>&1 | tee -a $S; }
cp /tmp/serve_*.log $OUT/ 2>/dev/null
log done
