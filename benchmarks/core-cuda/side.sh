#!/bin/bash
# The no-regression call of a GPU change (was run1.sh): the per-op tests' CUDA half, then a branch's splash (new)
# against main's (base) in one device call: cuda-check (new and base), greedy text new vs base, batch-1 decode tg128
# @ 512 of the synthetic 0.5B, 1.5B, 32B (Q4_K_M) and pp4096 of the 1.5B and 32B, alternated. Carry D (default
# .dev/cuda-trait) holding ops.xz (`cargo test --release -p splash-backend --test ops --no-run`, stripped),
# splash.xz and base.xz (stripped splash binaries); OUT gets summary.txt. About 250 s on the H200.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda-trait}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=/tmp/sh; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
for b in ops splash base; do [ -f $D/$b.xz ] && { xz -dc $D/$b.xz > /tmp/$b; chmod +x /tmp/$b; }; done
mv /tmp/splash /tmp/new
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
log synth
/tmp/new synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
/tmp/new synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
(/tmp/new synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1) &
SP=$!
warm() { timeout 200 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1_$2.log 2>&1; }
log "compile (and the per-op tests meanwhile)"; W=""; for b in new base; do for m in q15 q05; do warm $b $m & W="$W $!"; done; done
[ -x /tmp/ops ] && { mkdir -p /tmp/kc; SPLASH_CUDA_CACHE=/tmp/kc timeout 240 /tmp/ops cuda:: 2>&1 | grep -E "^test |test result|panicked|error" | tee -a $S; }
wait $W
grep -H -E "rror|anic" $OUT/warm_* | head | tee -a $S
for b in new base; do log "check q15 $b"; timeout 150 /tmp/$b cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S; done
log "check q05 new"; timeout 120 /tmp/new cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "greedy text new vs base"
for m in q15 q05; do for p in "def fibonacci(n):" "The quick brown fox"; do
  for b in new base; do timeout 60 /tmp/$b run -m /tmp/$m.gguf --device cuda --raw --prompt "$p" --max-tokens 48 --temperature 0 > $OUT/g_${b}_$m.txt 2>/dev/null; done
  cmp -s $OUT/g_new_$m.txt $OUT/g_base_$m.txt && echo "$m '$p': equal ($(wc -c < $OUT/g_new_$m.txt) bytes)" | tee -a $S || { echo "$m '$p': DIFFER" | tee -a $S; head -c 300 $OUT/g_new_$m.txt $OUT/g_base_$m.txt | tee -a $S; }
done; done
tg() { echo "$1 $2: $(timeout 120 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions $3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
pp() { echo "$1 $2: $(timeout 120 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 2 2>&1 | grep -E "^prefill|rror|anic" | tr '\n' ' ')" | tee -a $S; }
log "decode tg128 @ 512, alternated"
for r in 1 2; do tg new q15 3; tg base q15 3; done
for r in 1 2; do tg new q05 3; tg base q05 3; done
log "pp4096 q15, alternated"
for r in 1 2; do pp new q15; pp base q15; done
wait $SP; tail -1 $OUT/synth32.log | tee -a $S
(warm new q32; warm base q32); grep -H -E "rror|anic" $OUT/warm_*q32* | tee -a $S
log "q32 decode and pp4096"
tg new q32 2; tg base q32 2; pp new q32; pp base q32
log done
