#!/bin/bash
# Stretch-5 device run A: the q/k-norm + RoPE + KV-write refactor (main 3494963) and this stretch's changes checked
# (cuda-check on the 0.5B and 1.5B: same numbers as stretch 4 expected, the repacked layout and the attention
# split count change no sum), then decode A/B on the 1.5B (repacked Q4_K/Q6_K rows, attention splits that follow the
# context, argmax on the GPU; the stretch-4 binary as the same-machine baseline), the 32B (guq no longer spills),
# and Nsight Compute on the 32B's matrix kernels.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s5}; B=$D/splash; B4=$R/.dev/cuda/s4/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
(time $B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf) > $OUT/synth32.log 2>&1 &
SPID=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" ${BIN:-$B} bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "q15 ctx 512"; tg X=1
log "q15 ctx 512, stretch-4 binary"; BIN=$B4 tg X=1
log "q15 ctx 512, old layout"; tg SPLASH_CUDA_REPACK=0
log "q15 ctx 512, fixed attention splits"; tg SPLASH_CUDA_ATT_DYN=0
log "q15 ctx 16"; PT=16 tg X=1
log "q15 ctx 512, graph pdl"; tg SPLASH_CUDA_GRAPH_PDL=1
log "q15 ctx 512"; tg X=1
log "check q05"; timeout 200 $B cuda-check -m /tmp/q05.gguf -t 16 2>&1 | grep -v "^$" | tee -a $S
log "q05 ctx 512"; M=q05 tg X=1
wait $SPID; tail -3 $OUT/synth32.log | tee -a $S
log "q32 ctx 512"; M=q32 REPS=2 TO=200 tg X=1
log "q32 ctx 512, old layout"; M=q32 REPS=2 TO=200 tg SPLASH_CUDA_REPACK=0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
log "ncu q32 ($NCU)"
timeout 200 $NCU --clock-control none --graph-profiling node -k regex:"^(guq|mmvq|qkvq|quant_q8|attention|rope_kv)" \
  --launch-skip 1160 --launch-count 14 --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size \
  $B bench -m /tmp/q32.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 > $OUT/ncu.csv 2>&1
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
    t = m.get("gpu__time_duration.sum", 0.0); b = m.get("dram__bytes_read.sum", 0.0)
    print(f"{k[:44]:44s} {t:8.1f} us {b:9.2f} MB {b / t if t else 0:6.2f} TB/s regs {m.get('launch__registers_per_thread')} "
          f"warps {m.get('sm__warps_active.avg.pct_of_peak_sustained_active')}% grid {m.get('launch__grid_size')} x {m.get('launch__block_size')}")
PY
log done
