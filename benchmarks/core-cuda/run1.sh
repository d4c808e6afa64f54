#!/bin/bash
# core-cuda device call 1: cuda-check, greedy text vs main's binary, decode and pp4096 alternated with main's binary.
set -u
R=$(pwd); C=$R/.dev/cc; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=/tmp/sh; mkdir -p $SPLASH_HOME
S=$OUT/summary1.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
xz -dc $C/splash.xz > /tmp/new; xz -dc $R/.dev/base/splash.xz > /tmp/base; chmod +x /tmp/new /tmp/base
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
log synth
/tmp/new synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
/tmp/new synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
(/tmp/new synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1) &
SP=$!
warm() { timeout 200 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1_$2.log 2>&1; }
log "compile"; W=""; for b in new base; do for m in q15 q05; do warm $b $m & W="$W $!"; done; done; wait $W
grep -H -E "rror|anic" $OUT/warm_* | head | tee -a $S
log "check q15"; timeout 150 /tmp/new cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "check q05"; timeout 120 /tmp/new cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "greedy text new vs base"
for m in q15 q05; do for p in "def fibonacci(n):" "The quick brown fox"; do
  for b in new base; do timeout 60 /tmp/$b run -m /tmp/$m.gguf --device cuda --raw --prompt "$p" --max-tokens 48 --temperature 0 > $OUT/g_${b}_$m.txt 2>/dev/null; done
  cmp -s $OUT/g_new_$m.txt $OUT/g_base_$m.txt && echo "$m '$p': equal ($(wc -c < $OUT/g_new_$m.txt) bytes)" | tee -a $S || { echo "$m '$p': DIFFER" | tee -a $S; head -c 300 $OUT/g_new_$m.txt $OUT/g_base_$m.txt | tee -a $S; }
done; done
wait $SP; tail -1 $OUT/synth32.log | tee -a $S
(warm new q32; warm base q32) ; grep -H -E "rror|anic" $OUT/warm_*q32* | tee -a $S
tg() { echo "$1 $2: $(timeout 120 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions $3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
pp() { echo "$1 $2: $(timeout 120 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 2 2>&1 | grep -E "^prefill|rror|anic" | tr '\n' ' ')" | tee -a $S; }
log "decode tg128 @ 512, alternated"
for r in 1 2; do tg new q15 3; tg base q15 3; done
tg new q05 3; tg base q05 3
tg new q32 2; tg base q32 2
log "pp4096, alternated"
for r in 1 2; do pp new q15; pp base q15; done
pp new q32; pp base q32
log done
