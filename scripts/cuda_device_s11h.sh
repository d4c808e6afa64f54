#!/bin/bash
# Stretch-11 device call H: decode at the contexts coding agents run at (4K-16K), splash against llama.cpp, 1.5B.
# llama.cpp builds on cores 0-11 while splash (default settings) runs pinned to cores 12-15; llama-bench runs after the
# build: splash bench --prompt-tokens N vs llama-bench tg128 -d N.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s11}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
LLAMA_TAR=${LLAMA_TAR:-$R/.dev/cuda/llama.tar.xz}
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt; L=/tmp/l/llama.cpp/b/bin/llama-bench
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
(mkdir -p /tmp/l && cd /tmp/l && tar xJf $LLAMA_TAR && cd llama.cpp && \
 taskset -c 0-11 cmake -S . -B b -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_BUILD_TESTS=OFF \
   -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
   -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release && taskset -c 0-11 cmake --build b --target llama-bench -j 12) > /tmp/llama_build.log 2>&1 &
LPID=$!
T="taskset -c 12-15"
$T $B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$T $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > /dev/null 2>&1
for N in 512 4096 8192 16384; do
  echo "splash q15 decode @ $N: $($T timeout 120 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens $N --batch 4096 --gen-tokens 128 --repetitions 2 2>&1 | grep -E "^decode|rror" | tr '\n' ' ')" | tee -a $S
done
wait $LPID; log "llama.cpp built: $(tail -1 /tmp/llama_build.log)"
for N in 512 4096 8192 16384; do
  [ -x $L ] && echo "llama q15 tg128 @ d$N: $(timeout 100 $L -m /tmp/q15.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $N -r 2 2>&1 | grep "tg128" | awk -F'|' '{print $(NF-1)}')" | tee -a $S
done
log done
