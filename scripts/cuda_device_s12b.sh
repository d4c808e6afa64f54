#!/bin/bash
# Stretch 12, call B: decode ahead (SPLASH_CUDA_AHEAD, default on: the next step of a lone greedy sequence enqueued,
# its token fed on the device, before the last pick comes back) and decode attention splits that grow past 8K
# positions (SPLASH_CUDA_ATT_LONG, default 512 positions per split). Checks: cuda-check (with its new decode-ahead
# line) on the 1.5B and 0.5B, and at 10,240 positions (the longer launch); greedy text of `splash run` (the engine's
# ahead path with --spec-mode off) identical with ahead on and off and to the stretch-11 binary; speculation identity.
# Speed: decode @ 512, this binary with ahead on / off and stretch 11's, alternated; then long contexts, long splits
# on / off.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s12}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
D0=${D0:-$R/.dev/cuda/s11}
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt; W=/tmp/s12w; mkdir -p $W
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
log "compile"
for m in q15 q05; do timeout 240 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $W/warm_$m.log 2>&1 & done
SPLASH_CUDA_ATT_LONG=0 timeout 240 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $W/warm_long0.log 2>&1 &
for m in q15 q05; do SPLASH_HOME=/tmp/splash-home0 timeout 240 $D0/splash bench -m /tmp/$m.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $W/warm0_$m.log 2>&1 & done
wait
grep -h -E "rror|anic" $W/warm* | head -4 | tee -a $S
for m in q15 q05; do
  log "check $m"; timeout 200 $B cuda-check -m /tmp/$m.gguf -t 16 2>&1 | grep -E "^decode|batched|ahead|pick on|rror" | tee -a $S
done
log "greedy text: ahead on / off / stretch-11 binary"
for p in 110 440; do
  PR=$(for i in $(seq 1 $p); do printf 'fn f%d(x: u32) -> u32 { x + %d } ' $i $i; done)
  timeout 120 $B run -m /tmp/q15.gguf --device cuda --raw -p "$PR" --max-tokens 128 --temperature 0 --spec-mode off > $W/run_on_$p.txt 2>$W/run_on_$p.err
  SPLASH_CUDA_AHEAD=0 timeout 120 $B run -m /tmp/q15.gguf --device cuda --raw -p "$PR" --max-tokens 128 --temperature 0 --spec-mode off > $W/run_off_$p.txt 2>/dev/null
  SPLASH_HOME=/tmp/splash-home0 timeout 120 $D0/splash run -m /tmp/q15.gguf --device cuda --raw -p "$PR" --max-tokens 128 --temperature 0 --spec-mode off > $W/run_old_$p.txt 2>/dev/null
  echo "prompt $p fns: on/off $(cmp -s $W/run_on_$p.txt $W/run_off_$p.txt && echo identical || echo DIFFERENT), on/s11 $(cmp -s $W/run_on_$p.txt $W/run_old_$p.txt && echo identical || echo DIFFERENT), $(wc -c < $W/run_on_$p.txt) bytes; $(grep -h -i -E 'tok/s|rror' $W/run_on_$p.err | head -2 | tr '\n' ' ')" | tee -a $S
done
log "spec identity"
timeout 150 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -c "identical true" | tee -a $S
log "decode @ 512: ahead on (default) / off / stretch-11 binary, alternated"
b() { timeout 100 "$@" --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror" | tr '\n' ' '; }
for r in 1 2; do for m in q15 q05; do
  echo "$m on:  $(b $B bench -m /tmp/$m.gguf)" | tee -a $S
  echo "$m off: $(SPLASH_CUDA_AHEAD=0 b $B bench -m /tmp/$m.gguf)" | tee -a $S
  echo "$m s11: $(SPLASH_HOME=/tmp/splash-home0 b $D0/splash bench -m /tmp/$m.gguf)" | tee -a $S
done; done
log "host's turn with ahead off (SPLASH_CUDA_TIME_STEPS=1, which turns ahead off)"
SPLASH_CUDA_TIME_STEPS=1 timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 2 2>&1 | grep -E "steps|^decode" | tee -a $S
log "long contexts: att_long 512 (default) vs 0, alternated"
v() { echo "long=$1 $2 ctx=$3: $(SPLASH_CUDA_ATT_LONG=$1 timeout 120 $B bench -m /tmp/$2.gguf --device cuda --prompt-tokens $3 --batch 4096 --gen-tokens 128 --repetitions 2 2>&1 | grep -E "^decode|rror" | tr '\n' ' ')" | tee -a $S; }
for N in 12288 16384; do for L in 512 0; do v $L q15 $N; done; done
log "check q15 at 10,240 positions (long splits: 32-split launch past 8,192)"
timeout 300 $B cuda-check -m /tmp/q15.gguf -t 16 --positions 10240 2>&1 | grep -E "^decode|batched|ahead|rror" | tee -a $S
log done
