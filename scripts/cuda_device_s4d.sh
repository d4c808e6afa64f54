#!/bin/bash
# Stretch-4 device run D (final): llama.cpp built from the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp in the
# background while splash is checked (cuda-check 1.5B, 0.5B) and benchmarked (decode at context 512 and 16; 1.5B with
# SPLASH_CUDA_Q8_IT=1 too; 0.5B; 32B), then llama-bench tg128 at depth 0 and 512 on the same files.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s4}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
LLAMA_TAR=${LLAMA_TAR:-$R/.dev/cuda/llama.tar.xz}; BUILD_S=${BUILD_S:-420}
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
(mkdir -p /tmp/l && cd /tmp/l && tar xJf $LLAMA_TAR && cd llama.cpp && \
 cmake -S . -B b -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_BUILD_TESTS=OFF \
   -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
   -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release && cmake --build b --target llama-bench -j 14) > $OUT/llama_build.log 2>&1 &
LPID=$!
log synth
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
tg() { M=${M:-q15}; timeout 150 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} --gen-tokens 128 \
  --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "q15 ctx 512"; tg SPLASH_CUDA_Q8=1
log "q15 ctx 16"; PT=16 tg SPLASH_CUDA_Q8=1
log "q15 skip attention"; REPS=1 tg SPLASH_CUDA_PROFILE_SKIP=attention
log "q15 it=1"; tg SPLASH_CUDA_Q8_IT=1
log "q15 ctx 512 again"; tg SPLASH_CUDA_Q8=1
log "check q05"; timeout 200 $B cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "q05 ctx 512"; M=q05 tg SPLASH_CUDA_Q8=1
log "q05 ctx 16"; M=q05 PT=16 tg SPLASH_CUDA_Q8=1
log synth 32b; $B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf 2>&1 | tail -1 | tee -a $S
log "q32 ctx 512"; M=q32 REPS=2 tg SPLASH_CUDA_Q8=1
while kill -0 $LPID 2>/dev/null && [ $SECONDS -lt $BUILD_S ]; do sleep 5; done
if kill -0 $LPID 2>/dev/null; then log "llama.cpp build not done in $BUILD_S s; giving up"; kill -- -$LPID 2>/dev/null; kill $LPID; tail -3 $OUT/llama_build.log | tee -a $S; exit 0; fi
log llama.cpp built; tail -1 $OUT/llama_build.log | tee -a $S
for m in q15 q05 q32; do
  log llama-bench $m
  timeout 150 /tmp/l/llama.cpp/b/bin/llama-bench -m /tmp/$m.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0,512 -r 3 2>&1 | grep "^|" | tee -a $S
done
log "q15 ctx 512 after llama"; tg SPLASH_CUDA_Q8=1
log done
