#!/bin/bash
# Stretch-6 device run B: 8-bit activation rows in the permuted layout (SPLASH_CUDA_XPERM, default on: the
# matrix-vector kernels' activation loads coalesced) against the stretch-5 layout (SPLASH_CUDA_XPERM=0), and the
# streamed kernels of run A on top (SPLASH_CUDA_STREAM=1, now off by default), in one binary. Kernels for every
# variant are compiled first, in parallel, then cuda-check (1.5B, 0.5B; 1.5B also streamed and old layout), then timed
# runs in alternation, then Nsight Compute on one 32B layer.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s6}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1 &
SPID=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { M=$1; shift; timeout 240 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 \
  --repetitions 1 > $OUT/warm_${M}_$#_$RANDOM.log 2>&1; }
log "smoke q15 (compile)"
warm q15 X=1; rc=$?; tail -3 $OUT/warm_q15_1_* | tee -a $S
if [ $rc -ne 0 ]; then log "failed (rc $rc): stopping"; exit 1; fi
log "compile q15/q05 variants"
warm q15 SPLASH_CUDA_XPERM=0 & warm q15 SPLASH_CUDA_STREAM=1 & warm q05 SPLASH_CUDA_XPERM=0 &
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "check q05"; timeout 200 $B cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
wait
log "check q15, old layout"; timeout 200 env SPLASH_CUDA_XPERM=0 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
log "check q15, streamed"; timeout 200 env SPLASH_CUDA_STREAM=1 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
wait $SPID
log "compile q32 variants"
warm q32 X=1 & warm q32 SPLASH_CUDA_XPERM=0 & warm q32 SPLASH_CUDA_STREAM=1 &
wait
grep -h -E "rror|anic" $OUT/warm_* | head -5 | tee -a $S
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "q15 warm-up"; REPS=1 tg X=1
for r in 1 2; do
  log "q15 ctx 512, permuted activations [$r]"; tg X=1
  log "q15 ctx 512, stretch-5 layout [$r]"; tg SPLASH_CUDA_XPERM=0
done
log "q15 ctx 512, permuted + streamed"; tg SPLASH_CUDA_STREAM=1
log "q15 ctx 16"; PT=16 tg X=1
log "q05 ctx 512, permuted"; M=q05 tg X=1
log "q05 ctx 512, stretch-5 layout"; M=q05 tg SPLASH_CUDA_XPERM=0
for r in 1 2; do
  log "q32 ctx 512, permuted activations [$r]"; M=q32 REPS=2 TO=200 tg X=1
  log "q32 ctx 512, stretch-5 layout [$r]"; M=q32 REPS=2 TO=200 tg SPLASH_CUDA_XPERM=0
done
log "q32 ctx 512, permuted + streamed"; M=q32 REPS=2 TO=200 tg SPLASH_CUDA_STREAM=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
log "ncu q32 (permuted, not streamed)"
timeout 150 $NCU --clock-control none --graph-profiling node -k regex:"^(guq|gus|mmv|qkvq|quant_q8|attention|rope_kv)" \
  --launch-skip 1160 --launch-count 9 --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  $B bench -m /tmp/q32.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/ncu.csv 2>&1
python3 - $OUT/ncu.csv <<'PY' 2>&1 | tee -a $S
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print(open(sys.argv[1]).read()[-3000:]); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); mi = h.index("Metric Name"); vi = h.index("Metric Value"); ii = h.index("ID")
ui = h.index("Metric Unit")
sc = {"ns": 1e-3, "us": 1.0, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}
d = collections.OrderedDict()
for r in rows[1:]:
    v = r[vi].replace(",", "")
    try: v = float(v) * sc.get(r[ui], 1.0)
    except ValueError: pass
    d.setdefault((r[ii], r[ki]), {})[r[mi]] = v
for (i, k), m in d.items():
    t = m.get("gpu__time_duration.sum", 0.0); b = m.get("dram__bytes_read.sum", 0.0)
    print(f"{k[:44]:44s} {t:8.2f} us {b:9.2f} MB {b / t if t else 0:6.2f} TB/s")
PY
log done
