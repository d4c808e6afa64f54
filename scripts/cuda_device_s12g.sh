#!/bin/bash
# Stretch 12, call G: forward_argmax takes a step started ahead when its batch is that step (the last step of a
# greedy sequence at its output limit: engine, bench, cuda-check's ahead line). Checks and a speed sanity run; then
# the gate/up kernel with PDL inside the graphs too (SPLASH_CUDA_GRAPH_PDL_K=guq: +0.4% 1.5B, +1.3% 0.5B in stretch
# 12's final call) on the 32B and at aggregate, before it may join the default.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s12}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt; W=/tmp/s12w; mkdir -p $W
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
[ -f /tmp/q32.gguf ] || $B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > /dev/null 2>&1 &
SYN=$!
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "^decode|batched|ahead|pick on|rror" | tee -a $S
log "greedy text (engine, --spec-mode off, 200 tokens out): ahead on / off"
for p in 3 110; do
  PR=$(for i in $(seq 1 $p); do printf 'fn f%d(x: u32) -> u32 { x + %d } ' $i $i; done)
  timeout 120 $B run -m /tmp/q15.gguf --device cuda --raw -p "$PR" --max-tokens 200 --temperature 0 --spec-mode off > $W/run_on_$p.txt 2>$W/run_on_$p.err
  SPLASH_CUDA_AHEAD=0 timeout 120 $B run -m /tmp/q15.gguf --device cuda --raw -p "$PR" --max-tokens 200 --temperature 0 --spec-mode off > $W/run_off_$p.txt 2>/dev/null
  echo "prompt $p fns: $(cmp -s $W/run_on_$p.txt $W/run_off_$p.txt && echo identical || echo DIFFERENT), $(wc -c < $W/run_on_$p.txt) bytes; $(grep -h -i -E 'rror' $W/run_on_$p.err | head -2 | tr '\n' ' ')" | tee -a $S
done
log "decode @ 512"
for r in 1 2; do timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror" | tee -a $S; done
wait $SYN
log "gate/up PDL in graphs (guq) vs default, alternated"
g() { echo "pdl_k=$1 $2: $(SPLASH_CUDA_GRAPH_PDL_K=$1 timeout 200 $B bench -m /tmp/$2.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions $3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
for r in 1 2; do g guq q15 3; g , q15 3; done
g guq q05 3; g , q05 3
g guq q32 2; g , q32 2; g guq q32 2; g , q32 2
for k in guq ,; do echo "pdl_k=$k aggregate: $(SPLASH_CUDA_GRAPH_PDL_K=$k timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 1 --concurrent 16 --concurrent 64 2>&1 | grep -E "sequences" | tr '\n' ' ')" | tee -a $S; done
log done
