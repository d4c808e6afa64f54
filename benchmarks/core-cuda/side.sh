#!/bin/bash
# The no-regression call of a GPU change (was run1.sh): the per-op tests' CUDA half, then a branch's splash (new)
# against main's (base) in one device call: cuda-check (new and base), greedy text new vs base, batch-1 decode tg128
# @ 512 of the synthetic 0.5B, 1.5B, 32B (Q4_K_M) and pp4096 of the 1.5B and 32B, alternated. Carry D (default
# .dev/cuda-trait) holding ops.xz (`cargo test --release -p splash-backend --test ops --no-run`, stripped),
# splash.xz and base.xz (stripped splash binaries); OUT gets summary.txt. About 250 s on the H200.
# Optional in D: experts.xz and hfcuda.xz (the backend's `--test experts` and the models' `--test
# hf_reference_cuda`, built in the checkout at BUILT, default /work/main, whose fixture paths they read; run with
# their CUDA half) and long.txt (a prompt for one more greedy comparison: its prefill runs on tensor cores). QUICK=1:
# the 1.5B only, one round each (about 120 s).
set -u
R=$(pwd); D=${D:-$R/.dev/cuda-trait}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=/tmp/sh; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
MODELS="q15 q05"; ROUNDS="1 2"; [ -n "${QUICK:-}" ] && { MODELS=q15; ROUNDS=1; }
LONG=""; [ -f $D/long.txt ] && LONG=$(cat $D/long.txt)
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
for b in ops experts hfcuda splash base; do [ -f $D/$b.xz ] && { xz -dc $D/$b.xz > /tmp/$b; chmod +x /tmp/$b; }; done
mv /tmp/splash /tmp/new
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
log synth
/tmp/new synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
[ -z "${QUICK:-}" ] && /tmp/new synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
[ -z "${QUICK:-}" ] && (/tmp/new synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1) &
SP=$!
warm() { timeout 200 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1_$2.log 2>&1; }
log "compile (and the per-op tests meanwhile)"; W=""; for b in new base; do for m in $MODELS; do warm $b $m & W="$W $!"; done; done
mkdir -p /tmp/kc; BUILT=${BUILT:-/work/main}; [ -e $BUILT ] || { mkdir -p $(dirname $BUILT); ln -s $R $BUILT; }
for t in ops experts hfcuda; do
  [ -x /tmp/$t ] && { f=cuda::; [ $t = hfcuda ] && f=--nocapture; SPLASH_CUDA_CACHE=/tmp/kc timeout 200 /tmp/$t $f > $OUT/t_$t.log 2>&1 & W="$W $!"; }
done
wait $W
grep -H -E "rror|anic" $OUT/warm_* | head | tee -a $S
grep -h -E "^test |test result|panicked|cuda:" $OUT/t_*.log 2>/dev/null | tee -a $S
for b in new base; do log "check q15 $b"; timeout 150 /tmp/$b cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S; done
[ -z "${QUICK:-}" ] && log "check q05 new" && timeout 120 /tmp/new cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "greedy text new vs base"
for m in $MODELS; do for p in "def fibonacci(n):" "The quick brown fox" ${LONG:+"$LONG"}; do
  for b in new base; do timeout 60 /tmp/$b run -m /tmp/$m.gguf --device cuda --raw --prompt "$p" --max-tokens 48 --temperature 0 > $OUT/g_${b}_$m.txt 2>/dev/null; done
  cmp -s $OUT/g_new_$m.txt $OUT/g_base_$m.txt && echo "$m '${p:0:24}': equal ($(wc -c < $OUT/g_new_$m.txt) bytes)" | tee -a $S || { echo "$m '${p:0:24}': DIFFER" | tee -a $S; head -c 300 $OUT/g_new_$m.txt $OUT/g_base_$m.txt | tee -a $S; }
done; done
tg() { echo "$1 $2: $(timeout 120 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions $3 2>&1 | grep -E "^decode|rror|anic" | tr '\n' ' ')" | tee -a $S; }
pp() { echo "$1 $2: $(timeout 120 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 2 2>&1 | grep -E "^prefill|rror|anic" | tr '\n' ' ')" | tee -a $S; }
log "decode tg128 @ 512, alternated"
for m in $MODELS; do for r in $ROUNDS; do tg new $m 3; tg base $m 3; done; done
log "pp4096 q15, alternated"
for r in $ROUNDS; do pp new q15; pp base q15; done
[ -n "${QUICK:-}" ] && { log done; exit 0; }
wait $SP; tail -1 $OUT/synth32.log | tee -a $S
(warm new q32; warm base q32); grep -H -E "rror|anic" $OUT/warm_*q32* | tee -a $S
log "q32 decode and pp4096"
tg new q32 2; tg base q32 2; pp new q32; pp base q32
log done
