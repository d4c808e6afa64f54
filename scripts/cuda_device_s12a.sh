#!/bin/bash
# Next stretch's first device call (written in stretch 11, not yet run): query heads per block of the split attention
# launch (SPLASH_CUDA_ATT_HEADS; 1 = stretch 11's kernel). Each head's arithmetic is unchanged, so every figure must be
# identical: cuda-check (256 and 2,048 positions), greedy text at prompts of ~3,000 and ~12,000 tokens, speculation
# identity. Then decode at contexts 512-16K, alternated, on the 1.5B (heads 1, 2, 3) and the 0.5B (1, 2, 7 -> 2).
# With the stretch-11 binary at $D0/splash (measured: carry both folders), also its decode at 512 against this one's.
# Then splits per head at long contexts (SPLASH_CUDA_ATT_SPLITS 16 / 32 / 64) with heads 1 and 3.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s12}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
D0=${D0:-$R/.dev/cuda/s11}
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt; W=/tmp/s12w; mkdir -p $W
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { SPLASH_CUDA_ATT_HEADS=$2 timeout 240 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $W/warm_$1_$2.log 2>&1; }
log "compile"
for h in 1 2 3; do warm q15 $h & done; warm q05 1 & warm q05 2 & wait
grep -h -E "rror|anic" $W/warm_* | head -4 | tee -a $S
for h in 1 3; do for P in 256 2048; do
  log "check q15 heads $h positions $P"; SPLASH_CUDA_ATT_HEADS=$h timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 --positions $P 2>&1 | grep -E "^decode|batched|rror" | tee -a $S
done; done
log "greedy text, heads 1 vs 3"
for p in 110 440; do
  PR=$(for i in $(seq 1 $p); do printf 'fn f%d(x: u32) -> u32 { x + %d } ' $i $i; done)
  for h in 1 3; do SPLASH_CUDA_ATT_HEADS=$h timeout 120 $B run -m /tmp/q15.gguf --device cuda --raw -p "$PR" --max-tokens 128 --temperature 0 --spec-mode off > $W/run_${h}_$p.txt 2>/dev/null; done
  echo "prompt $p fns: $(cmp -s $W/run_1_$p.txt $W/run_3_$p.txt && echo identical || echo DIFFERENT)" | tee -a $S
done
log "spec (heads 3)"
SPLASH_CUDA_ATT_HEADS=3 timeout 120 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -c "identical true" | tee -a $S
v() { echo "heads=$1 $2 ctx=$3: $(SPLASH_CUDA_ATT_HEADS=$1 timeout 120 $B bench -m /tmp/$2.gguf --device cuda --prompt-tokens $3 --batch 4096 --gen-tokens 128 --repetitions 2 2>&1 | grep -E "^decode|rror" | tr '\n' ' ')" | tee -a $S; }
log "decode, alternated"
for N in 512 2048 4096 8192 16384; do for h in 1 2 3; do v $h q15 $N; done; done
for N in 4096 16384; do for h in 1 2; do v $h q05 $N; done; done
if [ -x $D0/splash ]; then
  log "decode @ 512, stretch-11 binary (old) vs this one (new), defaults"
  SPLASH_HOME=/tmp/splash-home0 timeout 240 $D0/splash bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > /dev/null 2>&1
  for r in 1 2; do for X in $D0/splash $B; do echo "$X: $(SPLASH_HOME=$([ $X = $B ] && echo $SPLASH_HOME || echo /tmp/splash-home0) timeout 100 $X bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode" | tr '\n' ' ')" | tee -a $S; done; done
fi
log "decode at long contexts: splits per head (SPLASH_CUDA_ATT_SPLITS) x heads per block"
w() { echo "splits=$1 heads=$2 ctx=$3: $(SPLASH_CUDA_ATT_SPLITS=$1 SPLASH_CUDA_ATT_HEADS=$2 timeout 120 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens $3 --batch 4096 --gen-tokens 128 --repetitions 2 2>&1 | grep -E "^decode|rror" | tr '\n' ' ')" | tee -a $S; }
for N in 4096 16384; do for sp in 16 32 64; do for h in 1 3; do w $sp $h $N; done; done; done
log "check q15 splits 64 heads 3, 4,096 positions"; SPLASH_CUDA_ATT_SPLITS=64 SPLASH_CUDA_ATT_HEADS=3 timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 --positions 4096 2>&1 | grep -E "^decode|batched|rror" | tee -a $S
log "aggregate 16 (split launch at any context)"; for h in 1 3; do echo "heads=$h: $(SPLASH_CUDA_ATT_HEADS=$h timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 1 --concurrent 16 2>&1 | grep -E "sequences" | tr '\n' ' ')" | tee -a $S; done
log done
