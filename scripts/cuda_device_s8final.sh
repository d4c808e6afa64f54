#!/bin/bash
# Stretch-8 final device run (lead): main after the merge, side by side with a fresh llama.cpp CUDA build in the same
# call. llama.cpp comes from the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp (packed as .dev/cuda/llama.tar.xz),
# built for sm_90a in the background while splash compiles its kernels and is checked against the CPU (cuda-check,
# speculation identity). The timed runs start only after the build, so they share the machine with nothing:
# batch-1 decode at context 512 (splash bench / llama-bench tg128 -d 512), prefill of 4096 tokens (llama.cpp's best
# setting -b 4096 -ub 2048), aggregate decode with 16 and 64 sequences, for the 1.5B, 0.5B and 32B synthetic files.
# Usage: D=$PWD/.dev/cuda/s8f bash scripts/cuda_device_s8final.sh   (carry .dev/cuda/s8f and .dev/cuda/llama.tar.xz)
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s8f}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
LLAMA_TAR=${LLAMA_TAR:-$R/.dev/cuda/llama.tar.xz}; BUILD_S=${BUILD_S:-380}
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
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf 2>&1 | tail -1 | tee -a $S
warm() { M=$1; timeout 240 $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 \
  > $OUT/warm_$M.log 2>&1; }
log "compile q15, q05, q32 (first start)"
warm q15 & warm q05 & warm q32 & wait
grep -H -E "rror|anic|^model" $OUT/warm_* | head -9 | tee -a $S
log "second start q15 (cache hit)"; warm q15; grep -E "rror|^model" $OUT/warm_q15.log | tee -a $S
log "check q15"; timeout 120 $B cuda-check -m /tmp/q15.gguf -t 8 2>&1 | grep -v "^$" | tee -a $S
log "check q05"; timeout 100 $B cuda-check -m /tmp/q05.gguf -t 8 2>&1 | grep -v "^$" | tee -a $S
log "spec, q15 + q05 draft"
timeout 120 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -vE "^\s*$" | tail -12 | tee -a $S
while kill -0 $LPID 2>/dev/null && [ $SECONDS -lt $BUILD_S ]; do sleep 5; done
if kill -0 $LPID 2>/dev/null; then log "llama.cpp build not done in $BUILD_S s; giving up on it"; kill $LPID; tail -3 $OUT/llama_build.log | tee -a $S; fi
L=/tmp/l/llama.cpp/b/bin/llama-bench
[ -x $L ] && log "llama.cpp built" && tail -1 $OUT/llama_build.log | tee -a $S
tg() { M=$1; shift; timeout 100 $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 "$@" 2>&1 \
  | grep -E "^(decode|prefill|aggregate)|concurr|rror|anic" | tee -a $S; }
for m in q15 q05 q32; do
  r=3; [ $m = q32 ] && r=2
  log "splash $m tg128 @ 512 [1]"; tg $m --repetitions $r
  [ -x $L ] && { log "llama-bench $m tg128 @ 512"; timeout 120 $L -m /tmp/$m.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 512 -r 3 2>&1 | grep "^|" | tee -a $S; }
  log "splash $m tg128 @ 512 [2]"; tg $m --repetitions $r
done
for m in q15 q32; do
  log "splash $m pp4096"; timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 \
    --repetitions 3 2>&1 | grep -E "^prefill|rror" | tee -a $S
  [ -x $L ] && { log "llama-bench $m pp4096 (best: -b 4096 -ub 2048)"; timeout 120 $L -m /tmp/$m.gguf -ngl 99 -fa 1 -p 4096 -n 0 \
    -b 4096 -ub 2048 -r 2 2>&1 | grep "^|" | tee -a $S; }
done
log "splash q15 aggregate 16 and 64 sequences"; tg q15 --repetitions 1 --concurrent 16 --concurrent 64
log done
