#!/bin/bash
# Stretch 12, call D: decode ahead without copies in the stream: the pass's pick reaches the host through a
# page-locked ring that argmax_rows writes, and a pass started ahead copies no metadata (its pick wrote the token and
# advanced the position) unless its page table grew. Checks as call B; speed against call B's binary (ahead with a
# pick copy and a metadata copy per step, $D1) and with ahead off.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s12}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
D1=${D1:-$R/.dev/cuda/s12c}
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt; W=/tmp/s12w; mkdir -p $W
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
[ -f /tmp/q15.gguf ] || $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -f /tmp/q05.gguf ] || $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
log "compile"
for m in q15 q05; do timeout 240 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $W/warm_$m.log 2>&1 & done
for m in q15 q05; do SPLASH_HOME=/tmp/splash-home1 timeout 240 $D1/splash bench -m /tmp/$m.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $W/warm1_$m.log 2>&1 & done
wait
grep -h -E "rror|anic" $W/warm* | head -4 | tee -a $S
for m in q15 q05; do
  log "check $m"; timeout 200 $B cuda-check -m /tmp/$m.gguf -t 16 2>&1 | grep -E "^decode|batched|ahead|pick on|rror" | tee -a $S
done
log "greedy text (engine, --spec-mode off): ahead on / off"
for p in 3 110 440; do
  PR=$(for i in $(seq 1 $p); do printf 'fn f%d(x: u32) -> u32 { x + %d } ' $i $i; done)
  timeout 120 $B run -m /tmp/q15.gguf --device cuda --raw -p "$PR" --max-tokens 200 --temperature 0 --spec-mode off > $W/run_on_$p.txt 2>$W/run_on_$p.err
  SPLASH_CUDA_AHEAD=0 timeout 120 $B run -m /tmp/q15.gguf --device cuda --raw -p "$PR" --max-tokens 200 --temperature 0 --spec-mode off > $W/run_off_$p.txt 2>/dev/null
  echo "prompt $p fns: $(cmp -s $W/run_on_$p.txt $W/run_off_$p.txt && echo identical || echo DIFFERENT), $(wc -c < $W/run_on_$p.txt) bytes; $(grep -h -i -E 'rror' $W/run_on_$p.err | head -2 | tr '\n' ' ')" | tee -a $S
done
log "spec identity"
timeout 150 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -c "identical true" | tee -a $S
log "decode @ 512: ring (this) on / off / copies (call B's binary), alternated"
b() { timeout 100 "$@" --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^decode|rror" | tr '\n' ' '; }
for r in 1 2 3; do for m in q15 q05; do
  echo "$m ring:   $(b $B bench -m /tmp/$m.gguf)" | tee -a $S
  echo "$m off:    $(SPLASH_CUDA_AHEAD=0 b $B bench -m /tmp/$m.gguf)" | tee -a $S
  echo "$m copies: $(SPLASH_HOME=/tmp/splash-home1 b $D1/splash bench -m /tmp/$m.gguf)" | tee -a $S
done; done
log "decode @ 16: ring / off"
for r in 1 2; do echo "q15 ring ctx16: $(timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 128 --repetitions 3 2>&1 | grep -E '^decode' | tr '\n' ' ')  off: $(SPLASH_CUDA_AHEAD=0 timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 128 --repetitions 3 2>&1 | grep -E '^decode' | tr '\n' ' ')" | tee -a $S; done
log done
