#!/bin/bash
# Stretch-9 device call H: where a decode step's wall time goes between the device and the host. With
# SPLASH_CUDA_TIME_STEPS=1, CUDA events around each pass give the device's time for the metadata copies and for the
# pass itself; `splash bench` prints them against the wall time per token (the rest is the host's turn). Binary in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s9}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { timeout 240 $B bench -m /tmp/$1.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1.log 2>&1; }
warm q15 & warm q05 & wait
for M in q15 q05; do
  for c in 0 84; do
    echo "$M candidates $c, untimed: $(timeout 100 $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 --candidates $c 2>&1 | grep -E '^decode|rror')"
    SPLASH_CUDA_TIME_STEPS=1 timeout 100 $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 --candidates $c 2>&1 | grep -E '^decode|steps|rror'
  done
done
