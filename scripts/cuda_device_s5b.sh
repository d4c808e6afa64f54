#!/bin/bash
# Stretch-5 device run B (final): after run A, the RMSNorm+quantization kernel issues all its loads before the first
# use and RoPE/KV write spreads over several blocks. cuda-check (1.5B, 0.5B), then decode with the repacked layout
# against the old one and the stretch-4 binary in alternation (run A's first runs were on a cold GPU), the 0.5B,
# the 32B (also with 2 and 4 pairs per thread), Nsight Compute on one 32B layer, and the plan from free GPU memory.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s5}; B=$D/splash; B4=$R/.dev/cuda/s4/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1 &
SPID=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" ${BIN:-$B} bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "q15 old layout (compile)"; REPS=1 tg SPLASH_CUDA_REPACK=0
log "q15 stretch-4 binary (compile)"; BIN=$B4 REPS=1 tg X=1
for r in 1 2; do
  log "q15 ctx 512 [$r]"; tg X=1
  log "q15 ctx 512, old layout [$r]"; tg SPLASH_CUDA_REPACK=0
  log "q15 ctx 512, stretch-4 binary [$r]"; BIN=$B4 tg X=1
done
log "q15 ctx 16"; PT=16 tg X=1
log "q15 ctx 16, stretch-4 binary"; BIN=$B4 PT=16 tg X=1
log "check q05"; timeout 200 $B cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "q05 ctx 512"; M=q05 tg X=1
log "q05 ctx 16"; M=q05 PT=16 tg X=1
wait $SPID
log "plan --device cuda"; $B plan -m /tmp/q32.gguf --device cuda 2>&1 | tee -a $S
log "q32 ctx 512"; M=q32 REPS=2 TO=200 tg X=1
log "q32 ctx 512, 2 pairs per thread"; M=q32 REPS=2 TO=200 tg SPLASH_CUDA_Q8_IT=2
log "q32 ctx 512 again"; M=q32 REPS=2 TO=200 tg X=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
log "ncu q32"
timeout 150 $NCU --clock-control none --graph-profiling node -k regex:"^(guq|mmvq|qkvq|quant_q8|attention|rope_kv)" \
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
