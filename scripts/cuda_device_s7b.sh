#!/bin/bash
# Stretch-7 device run B (after run A's fusions, now default): the 1.5B's gate/up kernel with the up rows' weights in
# shared memory via cp.async and 3 blocks per multiprocessor (SPLASH_CUDA_GU_SMEM=1: its 280 blocks in one wave instead
# of 264 + 16), and programmatic dependent launch inside the graphs (SPLASH_CUDA_GRAPH_PDL=1), alone and together,
# alternated after one warm-up; cuda-check of each kernel source; Nsight Compute on one decode layer.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s7}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { M=$1; shift; timeout 240 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 \
  --repetitions 1 > $OUT/warm_${M}_$RANDOM.log 2>&1; }
log "compile q15 default and GU_SMEM=1"
warm q15 X=1 & warm q15 SPLASH_CUDA_GU_SMEM=1 & wait
grep -h -E "rror|anic|compiled" $OUT/warm_* | head -5 | tee -a $S
log "check q15 (GU_SMEM=1)"; timeout 200 env SPLASH_CUDA_GU_SMEM=1 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode|prefill)|rror|anic|compiled" | tee -a $S; }
log "q15 warm-up"; REPS=1 tg X=1
for r in 1 2 3; do
  log "q15 ctx 512, default [$r]"; tg X=1
  log "q15 ctx 512, GU_SMEM=1 [$r]"; tg SPLASH_CUDA_GU_SMEM=1
  log "q15 ctx 512, GRAPH_PDL=1 [$r]"; tg SPLASH_CUDA_GRAPH_PDL=1
  log "q15 ctx 512, GU_SMEM=1 GRAPH_PDL=1 [$r]"; tg SPLASH_CUDA_GU_SMEM=1 SPLASH_CUDA_GRAPH_PDL=1
done
log "check q15 (GRAPH_PDL=1)"; timeout 200 env SPLASH_CUDA_GRAPH_PDL=1 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "decode|batched|greedy|rror" | tee -a $S
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for v in X=1 SPLASH_CUDA_GU_SMEM=1; do
log "ncu q15 one decode layer ($v)"
timeout 120 env $v $NCU --clock-control none --graph-profiling node -k regex:"^(guq|mmvq|qkvq|attention)" \
  --launch-skip 332 --launch-count 10 --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
  $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 4 --repetitions 1 > $OUT/ncu_$v.csv 2>&1
python3 - $OUT/ncu_$v.csv <<'PY' 2>&1 | tee -a $S
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print(open(sys.argv[1]).read()[-2000:]); sys.exit()
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
    w = m.get("sm__warps_active.avg.pct_of_peak_sustained_active", 0.0)
    print(f"{k[:30]:30s} {t:8.2f} us {b:8.2f} MB {b / t if t else 0:5.2f} TB/s warps {w:5.1f}%")
PY
done
log done
