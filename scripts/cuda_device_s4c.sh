#!/bin/bash
# Stretch-4 device run C: race fix (gate/up writes the down input into its own buffer), A/B of the fused 8-bit outputs
# (SPLASH_CUDA_GU_FUSE, SPLASH_CUDA_ATT_Q8), cuda-check, Nsight Compute per-kernel times of one decode step's first
# layers (1.5B), decode of the 0.5B and 32B. Needs $D holding `splash`.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s4}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
log synth
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
tg() { M=${M:-q15}; timeout 150 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 \
  --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "check q15 (first start compiles)"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "q8"; tg SPLASH_CUDA_Q8=1
log "att q8 off"; tg SPLASH_CUDA_ATT_Q8=0
log "gu fuse off"; tg SPLASH_CUDA_GU_FUSE=0
log "gu fuse off, skip guq_"; REPS=1 tg SPLASH_CUDA_GU_FUSE=0 SPLASH_CUDA_PROFILE_SKIP=guq_
log "q8"; tg SPLASH_CUDA_Q8=1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
log "ncu ($NCU)"
timeout 240 $NCU --clock-control none --graph-profiling node -k regex:"^(guq|mmvq|qkvq|quant_q8|attention|rope_kv)" \
  --launch-skip 256 --launch-count 32 --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size \
  $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 2 --repetitions 1 > $OUT/ncu.csv 2>&1
python3 - $OUT/ncu.csv <<'PY' 2>&1 | tee -a $S
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print(open(sys.argv[1]).read()[-3000:]); sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); mi = h.index("Metric Name"); vi = h.index("Metric Value"); ii = h.index("ID")
ui = h.index("Metric Unit")
sc = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}
d = collections.OrderedDict()
for r in rows[1:]:
    v = r[vi].replace(",", "")
    try: v = float(v) * sc.get(r[ui], 1.0)
    except ValueError: pass
    d.setdefault((r[ii], r[ki]), {})[r[mi]] = v
for (i, k), m in d.items():
    t = m.get("gpu__time_duration.sum", 0.0)
    b = m.get("dram__bytes_read.sum", 0.0)
    print(f"{i:>4} {k[:34]:34} {t:8.2f} us  dram {b:7.2f} MB  {b/max(t,1e-9)/1e6:6.2f} TB/s  regs {m.get('launch__registers_per_thread')}  warps {m.get('sm__warps_active.avg.pct_of_peak_sustained_active')}%  grid {m.get('launch__grid_size')} x {m.get('launch__block_size')}")
PY
log synth 0.5b; $B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
log "q05"; M=q05 tg SPLASH_CUDA_Q8=1
log synth 32b; $B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf 2>&1 | tail -1 | tee -a $S
log "q32"; M=q32 REPS=2 tg SPLASH_CUDA_Q8=1
log done
