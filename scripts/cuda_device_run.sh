#!/bin/bash
# The CUDA backend's checks and benchmarks on a GPU machine, in one command (what BENCHMARKS.md's CUDA section ran).
#
# Needs a release `splash` binary at $B (default .dev/cuda/splash) and writes logs to $OUT (default ./cuda-out).
# Steps: synthetic 0.5B / 1.5B / 32B files; cuda-check (CUDA vs CPU teacher-forced, batched vs unbatched) on the
# Q4_K_M mixes and on an f16 file; the CPU-vs-CPU noise floor of the same comparison (avx2 vs avx512 kernels);
# bench (decode, prefill, 16/64 concurrent sequences); pp4096; optionally llama.cpp's llama-bench built from the
# llama-cpp-python 0.3.36 sdist's vendor/llama.cpp packed as $LLAMA_TAR (cmake, ninja and nvcc needed there).
set -u
R=$(pwd); B=${B:-$R/.dev/cuda/splash}; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $S
if [ -n "${LLAMA_TAR:-}" ]; then
  (mkdir -p /tmp/l && cd /tmp/l && tar xJf $LLAMA_TAR && cd llama.cpp && \
   cmake -S . -B b -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
     -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release && cmake --build b --target llama-bench -j 12) > $OUT/llama_build.log 2>&1 &
  LPID=$!
fi
log synth
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf 2>&1 | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf 2>&1 | tee -a $S
for m in q05 q15; do
  log check $m; timeout 150 $B cuda-check -m /tmp/$m.gguf -t 16 2>&1 | tee -a $S
  log cpu-vs-cpu noise floor $m
  SPLASH_CPU_KERNELS=avx2 $B cuda-check -m /tmp/$m.gguf -t 16 --cpu-dump /tmp/$m.avx2 >/dev/null 2>&1
  $B cuda-check -m /tmp/$m.gguf -t 16 --cpu-compare /tmp/$m.avx2 2>&1 | tee -a $S
done
log check f16 1.5b shape
$B synth --like qwen2.5-coder-1.5b --quant f16 -o /tmp/f16.gguf && timeout 150 $B cuda-check -m /tmp/f16.gguf -t 16 2>&1 | tee -a $S
for q in q4_k q6_k q8_0 q5_0 q4_0 q4_1; do
  log check 1.5b shape, 1 layer, all $q
  $B synth --like qwen2.5-coder-1.5b --layers 1 --quant $q -o /tmp/t.gguf && timeout 60 $B cuda-check -m /tmp/t.gguf -t 16 2>&1 | tee -a $S
done
for m in q15 q05; do
  log bench $m
  timeout 150 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 --concurrent 16 --concurrent 64 2>&1 | tee -a $S
  log pp4096 $m
  timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 2 2>&1 | tee -a $S
done
log synth 32b; $B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf 2>&1 | tee -a $S
log bench 32b
timeout 300 $B bench -m /tmp/q32.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 2 --concurrent 16 2>&1 | tee -a $S
if [ -n "${LPID:-}" ]; then
  wait $LPID
  for m in /tmp/q15.gguf /tmp/q05.gguf /tmp/q32.gguf; do
    log llama-bench $m
    /tmp/l/llama.cpp/b/bin/llama-bench -m $m -ngl 99 -fa 1 -p 4096 -n 128 -b 4096 -ub 2048 -r 2 2>&1 | grep "^|" | tee -a $S
  done
fi
log done
