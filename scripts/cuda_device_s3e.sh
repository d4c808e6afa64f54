#!/bin/bash
# Stretch-3 device run 5: llama.cpp built from the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp (packed as
# $LLAMA_TAR), then llama-bench and splash bench on the same synthetic files in the same run. Gives up on llama.cpp
# when its build is not done within $BUILD_S seconds.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s3}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
LLAMA_TAR=${LLAMA_TAR:-$R/.dev/cuda/llama.tar.xz}; BUILD_S=${BUILD_S:-450}
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
(mkdir -p /tmp/l && cd /tmp/l && tar xJf $LLAMA_TAR && cd llama.cpp && \
 cmake -S . -B b -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_BUILD_TESTS=OFF \
   -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
   -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release && cmake --build b --target llama-bench -j 16) > $OUT/llama_build.log 2>&1 &
LPID=$!
log synth
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf 2>&1 | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf 2>&1 | tee -a $S
while kill -0 $LPID 2>/dev/null && [ $SECONDS -lt $BUILD_S ]; do sleep 5; done
if kill -0 $LPID 2>/dev/null; then log "llama.cpp build not done in $BUILD_S s; giving up"; kill -- -$LPID 2>/dev/null; kill $LPID; tail -3 $OUT/llama_build.log | tee -a $S; exit 0; fi
log llama.cpp built; tail -2 $OUT/llama_build.log | tee -a $S
for m in q15 q05; do
  log llama-bench $m
  timeout 120 /tmp/l/llama.cpp/b/bin/llama-bench -m /tmp/$m.gguf -ngl 99 -fa 1 -p 4096 -n 128 -b 4096 -ub 2048 -r 2 2>&1 | grep "^|" | tee -a $S
  log splash $m
  timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 3 2>&1 | grep -E "^prefill" | tee -a $S
  timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | grep -E "^(prefill|decode)" | tee -a $S
done
log done
