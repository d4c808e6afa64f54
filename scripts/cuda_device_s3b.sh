#!/bin/bash
# Stretch-3 device run 2: unit test, PDL on/off A/B (correctness and decode speed), 32B prefill, concurrency.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s3}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
log synth
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf 2>&1 | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf 2>&1 | tee -a $S
(log synth 32b; $B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1; log synth 32b done) &
SYN=$!
log unit test
timeout 200 $D/splash-test tensor_core --nocapture 2>&1 | grep -E "vs cpu|test result|panicked" | tee -a $S
log check q15 PDL on
SPLASH_CUDA_PDL=1 timeout 150 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
for m in q15 q05; do
  for pdl in 0 1 0 1; do
    log tg128 $m PDL=$pdl
    SPLASH_CUDA_PDL=$pdl timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "prefill|decode" | tee -a $S
  done
  log pp4096 $m PDL=1
  SPLASH_CUDA_PDL=1 timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 3 2>&1 | grep -E "prefill" | tee -a $S
  log pp4096 $m PDL=0
  timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 3 2>&1 | grep -E "prefill" | tee -a $S
done
log concurrency q15 PDL=1
SPLASH_CUDA_PDL=1 timeout 150 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 2 --concurrent 16 --concurrent 64 2>&1 | grep -v "^$" | tail -6 | tee -a $S
log spec self-draft PDL=1
SPLASH_CUDA_PDL=1 timeout 150 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q15.gguf --spec-mode draft --spec-fixed-depth --spec-depth 4 --gen-tokens 64 --workload code 2>&1 | grep -E "identical|pass cost" | tee -a $S
wait $SYN; cat $OUT/synth32.log | tee -a $S
log pp4096 32b
timeout 150 $B bench -m /tmp/q32.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 2 2>&1 | grep -v "^$" | tee -a $S
for pdl in 0 1; do
  log tg128 32b PDL=$pdl
  SPLASH_CUDA_PDL=$pdl timeout 100 $B bench -m /tmp/q32.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 2 2>&1 | grep -E "prefill|decode" | tee -a $S
done
log done
