#!/bin/bash
# Stretch-3 device run: tensor-core prefill checks and benchmarks, GPU speculation on/off identity, `serve` smoke test.
# Needs $D (default .dev/cuda/s3) holding `splash` and `splash-test` (the cli unit-test binary); logs to $OUT.
# STEPS (default all): any of unit check bench spec serve big llama.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s3}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
STEPS=${STEPS:-"unit check bench spec serve"}
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
has() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
if ! ldconfig -p | grep -q 'libcublas\.so'; then
  L=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.1*' 2>/dev/null | head -1)
  [ -n "$L" ] && export LD_LIBRARY_PATH=$(dirname $L)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  log "libcublas not in the ld cache; using $L"
else
  log "libcublas: $(ldconfig -p | grep 'libcublas\.so' | head -2 | tr '\n' ' ')"
fi
if has llama && [ -f $R/.dev/cuda/llama.tar.xz ]; then
  (mkdir -p /tmp/l && cd /tmp/l && tar xJf $R/.dev/cuda/llama.tar.xz && cd llama.cpp && \
   cmake -S . -B b -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_BUILD_TESTS=OFF \
     -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
     -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release && cmake --build b --target llama-bench -j 10) > $OUT/llama_build.log 2>&1 &
  LPID=$!
fi
log synth
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf 2>&1 | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf 2>&1 | tee -a $S
if has unit; then
  log unit test: tensor-core prefill vs cpu
  timeout 240 $D/splash-test tensor_core --nocapture 2>&1 | grep -v "^$" | tail -12 | tee -a $S
fi
if has check; then
  for m in q15 q05; do log check $m; timeout 150 $B cuda-check -m /tmp/$m.gguf -t 16 2>&1 | tee -a $S; done
  log check f16 1.5b shape
  $B synth --like qwen2.5-coder-1.5b --quant f16 -o /tmp/f16.gguf >/dev/null 2>&1 && timeout 150 $B cuda-check -m /tmp/f16.gguf -t 16 2>&1 | tee -a $S
fi
if has bench; then
  for m in q15 q05; do
    log pp4096 $m
    timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 3 2>&1 | tee -a $S
    log pp512 + tg128 $m
    timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 2>&1 | tee -a $S
  done
  log pp4096 q15, matrix-vector path only
  SPLASH_CUDA_GEMM=0 timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 1 2>&1 | tee -a $S
fi
if has spec; then
  log spec q15, draft q05
  timeout 200 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | tee -a $S
  log spec q15, self-draft fixed depth 4
  timeout 200 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q15.gguf --spec-mode draft --spec-fixed-depth --spec-depth 4 --gen-tokens 96 --workload code 2>&1 | tee -a $S
fi
if has serve; then
  log serve smoke test
  $B serve -m /tmp/q15.gguf --device cuda --port 8123 > $OUT/serve.log 2>&1 &
  SP=$!
  for i in $(seq 1 90); do curl -sf localhost:8123/v1/models > /tmp/models.json 2>/dev/null && break; sleep 1; done
  cat /tmp/models.json | head -c 400 | tee -a $S; echo | tee -a $S
  MID=$(python3 -c 'import json;print(json.load(open("/tmp/models.json"))["data"][0]["id"])' 2>/dev/null || echo q15)
  curl -s localhost:8123/v1/chat/completions -H 'content-type: application/json' \
    -d "{\"model\":\"$MID\",\"messages\":[{\"role\":\"user\",\"content\":\"Write a haiku about GPUs.\"}],\"max_tokens\":24,\"temperature\":0}" | head -c 1200 | tee -a $S; echo | tee -a $S
  curl -sN localhost:8123/v1/chat/completions -H 'content-type: application/json' \
    -d "{\"model\":\"$MID\",\"messages\":[{\"role\":\"user\",\"content\":\"Write a haiku about GPUs.\"}],\"max_tokens\":8,\"temperature\":0,\"stream\":true}" | head -c 2500 | tee -a $S; echo | tee -a $S
  kill $SP; wait $SP 2>/dev/null
  tail -5 $OUT/serve.log | tee -a $S
fi
if has big; then
  log synth 32b; $B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf 2>&1 | tee -a $S
  log pp4096 32b
  timeout 150 $B bench -m /tmp/q32.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 2 2>&1 | tee -a $S
fi
if [ -n "${LPID:-}" ]; then
  log waiting for llama.cpp build; wait $LPID; tail -3 $OUT/llama_build.log | tee -a $S
  for m in /tmp/q15.gguf /tmp/q05.gguf $( [ -f /tmp/q32.gguf ] && echo /tmp/q32.gguf ); do
    log llama-bench $m
    timeout 120 /tmp/l/llama.cpp/b/bin/llama-bench -m $m -ngl 99 -fa 1 -p 4096 -n 128 -b 4096 -ub 2048 -r 2 2>&1 | grep "^|" | tee -a $S
  done
fi
log done
