#!/bin/bash
# Stretch-3 device run 3: final correctness and speed of the default build, decode A/B of the fusion switches, a
# leave-one-stage-out decode profile, speculation on/off identity and a `serve` smoke test.
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
$B synth --like qwen2.5-coder-1.5b --quant f16 -o /tmp/f16.gguf 2>&1 | tee -a $S
log unit test
timeout 200 $D/splash-test tensor_core --nocapture 2>&1 | grep -E "vs cpu|test result|panicked" | tee -a $S
for m in q15 q05 f16; do log check $m; timeout 150 $B cuda-check -m /tmp/$m.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S; done
log check q15 with FUSE_FFN_NORM=1 FUSE_ROPE=1
SPLASH_CUDA_FUSE_FFN_NORM=1 SPLASH_CUDA_FUSE_ROPE=1 timeout 150 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "vs cpu|batched" | tee -a $S
for m in q15 q05; do
  log pp4096 $m; timeout 100 $B bench -m /tmp/$m.gguf --device cuda --prompt-tokens 4096 --batch 4096 --gen-tokens 0 --repetitions 3 2>&1 | grep -E "^prefill" | tee -a $S
  for round in 1 2; do
    log "$m round $round default:            $(tg $m)"
    log "$m round $round FFN_NORM:           $(SPLASH_CUDA_FUSE_FFN_NORM=1 tg $m)"
    log "$m round $round ROPE:               $(SPLASH_CUDA_FUSE_ROPE=1 tg $m)"
    log "$m round $round FFN_NORM+ROPE:      $(SPLASH_CUDA_FUSE_FFN_NORM=1 SPLASH_CUDA_FUSE_ROPE=1 tg $m)"
  done
done
log leave-one-stage-out decode profile, q15 '(wrong outputs; time by difference)'
for sk in none qkvn rope_kv attention mmv_12_1536 rms_norm mmvgu _8960_ mmv_14_1536_1 "qkvn,rope_kv,attention,mmv_,rms_norm,mmvgu"; do
  log "skip $sk: $(SPLASH_CUDA_PROFILE_SKIP=$sk tg q15)"
done
log concurrency q15
timeout 150 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 2 --concurrent 16 --concurrent 64 2>&1 | grep -E "^(prefill|decode)" | tee -a $S
log spec q15 draft q05
timeout 200 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -E "identical|pass cost" | tee -a $S
log spec q15 self-draft
timeout 200 $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q15.gguf --spec-mode draft --spec-fixed-depth --spec-depth 4 --gen-tokens 96 --workload code 2>&1 | grep -E "identical|pass cost" | tee -a $S
log serve
$B serve -m /tmp/q15.gguf --device cuda --port 8123 > $OUT/serve.log 2>&1 &
SP=$!
for i in $(seq 1 90); do curl -sf localhost:8123/v1/models > /dev/null 2>&1 && break; sleep 1; done
curl -s localhost:8123/v1/chat/completions -H 'content-type: application/json' -d '{"model":"q15","messages":[{"role":"user","content":"Write a haiku about GPUs."}],"max_tokens":16,"temperature":0}' | head -c 700 | tee -a $S; echo | tee -a $S
curl -sN localhost:8123/v1/chat/completions -H 'content-type: application/json' -d '{"model":"q15","messages":[{"role":"user","content":"Write a haiku about GPUs."}],"max_tokens":4,"temperature":0,"stream":true}' | grep -c '^data:' | sed 's/^/SSE data lines: /' | tee -a $S
kill $SP; wait $SP 2>/dev/null
log done
