#!/bin/bash
# Stretch 12, call G: forward_argmax takes a step started ahead when its batch is that step (the last step of a
# greedy sequence at its output limit: engine, bench, cuda-check's ahead line). Checks and a speed sanity run.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s12}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt; W=/tmp/s12w; mkdir -p $W
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
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
log done
