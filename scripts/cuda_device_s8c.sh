#!/bin/bash
# Stretch-8 device run C (final binary): SPLASH_CUDA_GU_DOT2 now on by default (=0: the stretch-7 gate/up); WCG now
# applies to the 16-byte (Q4_K / Q6_K) weight loads only (call B: the 0.5B's narrow Q5_0 / Q8_0 loads ran 24% slower
# through L2 alone); GU_LASTQ removed (call B: 32B 118-120 vs 138). cuda-check of the defaults (same figures
# expected; speculation identity was run in calls A and B with the same sums), then timed runs alternated after one warm-up: off / default / default + WCG.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s8cc}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
OFF="SPLASH_CUDA_GU_DOT2=0"; NEW="X=1"; NW="SPLASH_CUDA_WCG=1"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1 &
SPID=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { local M=$1; shift; timeout 200 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 \
  --repetitions 1 > $OUT/w_${M}_$RANDOM.log 2>&1; }
log "compile q15 x3, q05 x3"
P=""
for v in "q15 $OFF" "q15 $NEW" "q15 $NW" "q05 $OFF" "q05 $NEW" "q05 $NW"; do warm $v & P="$P $!"; done
wait $P
grep -h -E "rror|anic" $OUT/w_* | head -8 | tee -a $S
( wait $SPID; for v in "$OFF" "$NEW" "$NW"; do warm q32 $v & done; wait ) > /dev/null 2>&1 &
CPID=$!
ck() { local M=$1; shift; log "check $M ($*)"; timeout 150 env "$@" $B cuda-check -m /tmp/$M.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S; }
ck q15 $NEW
ck q05 $NEW
ck q15 $NW
tg() { local M=${M:-q15}; timeout ${TO:-150} env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode)|rror|anic" | tee -a $S; }
log "q15 warm-up"; REPS=1 tg $NEW
for r in 1 2 3; do
  for v in "$OFF" "$NEW" "$NW"; do log "q15 ctx 512, $v [$r]"; tg $v; done
done
log "q15 ctx 16, $OFF"; PT=16 tg $OFF
log "q15 ctx 16, $NEW"; PT=16 tg $NEW
for r in 1 2; do
  for v in "$OFF" "$NEW" "$NW"; do log "q05 ctx 512, $v [$r]"; M=q05 tg $v; done
done
wait $CPID
log "q32 compiled"; grep -h -E "rror|anic" $OUT/w_q32* | head -3 | tee -a $S
for v in "$OFF" "$NEW" "$NW" "$NEW" "$NW"; do log "q32 ctx 512, $v"; M=q32 REPS=2 TO=100 tg $v; done
log done
