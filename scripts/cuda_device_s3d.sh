#!/bin/bash
# Stretch-3 device run 4 (final build): vector loads for Q4_K headers and 16-byte-aligned (repacked) Q6_K blocks.
# Correctness on the changed types, final speed table (0.5B, 1.5B, 32B), decode profile, speculation identity.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s3}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
tg() { timeout 100 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^(prefill|decode)" | tr '\n' ' '; echo; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $S
log synth
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf 2>&1 | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf 2>&1 | tee -a $S
for q in q6_k q4_k; do $B synth --like qwen2.5-coder-1.5b --layers 1 --quant $q -o /tmp/t_$q.gguf 2>&1 | tee -a $S; done
($B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1) &
SYN=$!
log unit test
timeout 200 $D/splash-test tensor_core --nocapture 2>&1 | grep -E "vs cpu|test result|panicked" | tee -a $S
for m in q15 q05 t_q6_k t_q4_k; do log check $m; timeout 150 $B cuda-check -m /tmp/$m.gguf -t 16 2>&1 | grep -E "vs cpu|batched|compiled" | tee -a $S; done
for m in q15 q05; do
  log pp4096 $m; timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 3 2>&1 | grep -E "^prefill" | tee -a $S
  for round in 1 2 3; do log "$m round $round: $(tg $m)"; done
done
for sk in mmvgu _8960_ mmv_14_1536_1 attention; do log "q15 skip $sk: $(SPLASH_CUDA_PROFILE_SKIP=$sk tg q15)"; done
log concurrency q15
timeout 150 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 2 --concurrent 16 --concurrent 64 2>&1 | grep -E "^decode" | tee -a $S
log spec q15 draft q05
timeout 200 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 64 2>&1 | grep -E "identical|pass cost" | tee -a $S
wait $SYN; cat $OUT/synth32.log | tee -a $S
log 32b pp4096; timeout 150 $B bench -m /tmp/q32.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 2 2>&1 | grep -E "cuda:|prefill" | tee -a $S
log 32b tg128 + 16 seqs; timeout 150 $B bench -m /tmp/q32.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 2 --concurrent 16 2>&1 | grep -E "^(prefill|decode)" | tee -a $S
log done
