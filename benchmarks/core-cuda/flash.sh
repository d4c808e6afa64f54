#!/bin/bash
# The fused prefill attention (flash_attention.cu) on the H200 in one call: the standalone harness
# (scripts/cuda/flash_attn_test.py: errors against an f32 reference and the GEMM path it replaces, times), then a
# branch's splash (new) against main's (base) on the synthetic 1.5B Q4_K_M: cuda-check, greedy text on a long prompt
# (its prefill runs on tensor cores), pp16384 and pp4096 alternated, the 74-token tail after 16,266 positions (by
# difference), and the new binary with SPLASH_CUDA_FLASH_WARPS=8. Carry D (default .dev/flash) holding new.xz
# (stripped splash), flash_attention.cu, flash_attn_test.py and this script, and B (default .dev/lead/main) holding
# main's splash.xz. OUT gets summary.txt and harness.txt.
set -u
R=$(pwd); D=${D:-$R/.dev/flash}; B=${B:-$R/.dev/lead/main}; OUT=${OUT:-$R/flash-out}; mkdir -p $OUT
export SPLASH_HOME=/tmp/sh; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
xz -dc $D/new.xz > /tmp/new; xz -dc $B/splash.xz > /tmp/base; chmod +x /tmp/new /tmp/base
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
log synth
/tmp/new synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
warm() { env $3 timeout 200 /tmp/$1 bench -m /tmp/$2.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/warm_$1_$4.log 2>&1; }
log "compile new, new (8 warps), base in the background; the harness meanwhile"
W=""; warm new q15 X=1 4 & W="$W $!"; warm new q15 SPLASH_CUDA_FLASH_WARPS=8 8 & W="$W $!"; warm base q15 X=1 b & W="$W $!"
PYTHONUNBUFFERED=1 timeout 110 python3 $D/flash_attn_test.py --flash $D/flash_attention.cu --kernels $R/crates/backend/src/cuda/kernels.cu > $OUT/harness.txt 2>&1
echo "harness exit $?" | tee -a $S; sed -n '/^summary/,$p' $OUT/harness.txt | tee -a $S; grep -E "FAIL|rror" $OUT/harness.txt | head -5 | tee -a $S
wait $W
grep -H -E "rror|anic" $OUT/warm_* | head | tee -a $S
for b in new base; do log "check q15 $b"; timeout 100 /tmp/$b cuda-check -m /tmp/q15.gguf 2>&1 | grep -E "vs cpu|batched|error|FAIL|PASS" | tee -a $S; done
log "greedy text new vs base (a 700-token prompt: prefill on tensor cores)"
P=$(for i in $(seq 1 40); do printf 'def f%d(x):\n    return x * %d + %d\n' $i $i $((i * 7 % 13)); done)
for b in new base; do timeout 60 /tmp/$b run -m /tmp/q15.gguf --device cuda --raw --prompt "$P" --max-tokens 48 --temperature 0 > $OUT/g_$b.txt 2>/dev/null; done
cmp -s $OUT/g_new.txt $OUT/g_base.txt && echo "greedy equal ($(wc -c < $OUT/g_new.txt) bytes)" | tee -a $S || { echo "greedy DIFFER" | tee -a $S; head -c 300 $OUT/g_new.txt $OUT/g_base.txt | tee -a $S; }
pp() { echo "$1 $3 pp$2: $(env $3 timeout 60 /tmp/$1 bench -m /tmp/q15.gguf --device cuda --prompt-tokens $2 --batch ${4:-$2} --gen-tokens 0 --repetitions 3 2>&1 | grep -E "^prefill|rror|anic" | tr '\n' ' ')" | tee -a $S; }
log "pp16384 and pp4096, alternated"
for r in 1 2; do pp new 16384 X=1; pp base 16384 X=1; done
for r in 1 2; do pp new 4096 X=1; pp base 4096 X=1; done
pp new 16384 SPLASH_CUDA_FLASH_WARPS=8; pp new 4096 SPLASH_CUDA_FLASH_WARPS=8
log "the 74-token tail after 16,266 (16340 - 16266 tokens, one chunk of 16,266 first)"
for b in new base; do pp $b 16266 X=1 16266; pp $b 16340 X=1 16266; done
log done
