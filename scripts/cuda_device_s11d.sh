#!/bin/bash
# Stretch-11 device call D: clustered decode attention (default SPLASH_CUDA_ATT_CL=8: one cluster of 8 splits while
# every context fits 1,024 positions, else the 16-split launch in a graph of its own) against 0 (always the
# 16-split launch with the global merge). Correctness: cuda-check; greedy text identical across the two at prompts
# of ~700, ~960 (crossing 1,024 while generating) and ~3,000 tokens; speculation identity. Then decode at contexts
# 512, 960 and 2048, alternated; aggregate 16 / 64 sequences.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s11}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt; W=/tmp/s11w; mkdir -p $W
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
B=$D/splash
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { SPLASH_CUDA_ATT_CL=$2 timeout 240 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $W/warm_$1_$2.log 2>&1; }
log "compile"
for c in 0 8; do warm q15 $c & warm q05 $c & done; wait
grep -h -E "rror|anic" $W/warm_* | head -4 | tee -a $S
for M in q15 q05; do
  log "check $M (default)"; timeout 150 $B cuda-check -m /tmp/$M.gguf -t 8 2>&1 | grep -E "vs cpu|batched|device|rror" | tee -a $S
done
log "greedy text, same prompt, ATT_CL 8 vs 0"
for p in 26 36 110; do
  PR=$(for i in $(seq 1 $p); do printf 'fn f%d(x: u32) -> u32 { x + %d } ' $i $i; done)
  for c in 0 8; do SPLASH_CUDA_ATT_CL=$c timeout 120 $B run -m /tmp/q15.gguf --device cuda --raw -p "$PR" --max-tokens 128 --temperature 0 --spec-mode off --stats > $W/run_${c}_$p.txt 2> $W/run_${c}_$p.err; done
  echo "prompt $p fns: $(cmp -s $W/run_0_$p.txt $W/run_8_$p.txt && echo identical || echo DIFFERENT) ($(wc -c < $W/run_0_$p.txt) bytes; $(grep -o '"prompt_tokens":[0-9]*' $W/run_8_$p.err))" | tee -a $S
done
log "spec, q15 + q05 draft (default)"
timeout 120 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -E "identical|rror" | awk '{print $1, $2, $4, $5, $13, $14}' | tr '\n' ';' | tee -a $S; echo | tee -a $S
tg() { L=$1; M=$2; shift 2; echo "$L $M: $(timeout 100 $B bench -m /tmp/$M.gguf --device cuda --gen-tokens 128 "$@" 2>&1 | grep -E "^(decode|aggregate)|steps|rror|anic" | tr '\n' ' ')" | tee -a $S; }
v() { SPLASH_CUDA_ATT_CL=$1 tg "cl=$1 ctx=$3" $2 --prompt-tokens $3 --repetitions 3; }
log "decode, alternated"
for r in 1 2 3; do for c in 0 8; do v $c q15 512; done; done
for r in 1 2; do for c in 0 8; do v $c q15 960; done; done
for r in 1 2; do for c in 0 8; do v $c q15 2048; done; done
for r in 1 2; do for c in 0 8; do v $c q05 512; done; done
log "aggregate q15"; for c in 0 8; do SPLASH_CUDA_ATT_CL=$c tg "cl=$c" q15 --prompt-tokens 512 --repetitions 1 --concurrent 16 --concurrent 64; done
log done
