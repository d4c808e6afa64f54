#!/bin/bash
# Stretch-8 device run B. Call A measured SPLASH_CUDA_GU_DOT2=1 faster (1.5B +1.5%, 32B +4%) and SPLASH_CUDA_X6=1 about
# equal. New here: weights loaded with ld.global.cg, L2 only (SPLASH_CUDA_WCG=1: the streamed weights no longer evict
# the re-read activation rows from L1), and the 32B's down-input quantization done by the last gate/up block of each
# 32 rows (SPLASH_CUDA_GU_LASTQ=1: one launch per layer fewer). cuda-check of each (same figures expected), timed
# runs alternated after one warm-up, speculation identity, Nsight Compute on one 32B and one 1.5B layer.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s8cb}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
OFF="X=1"; DO="SPLASH_CUDA_GU_DOT2=1"; DX="$DO SPLASH_CUDA_X6=1"; DXW="$DX SPLASH_CUDA_WCG=1"
DXL="$DX SPLASH_CUDA_GU_LASTQ=1"; DXWL="$DXW SPLASH_CUDA_GU_LASTQ=1"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $S
$B synth --like qwen2.5-coder-32b -o /tmp/q32.gguf > $OUT/synth32.log 2>&1 &
SPID=$!
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
$B synth --like qwen2.5-coder-0.5b -o /tmp/q05.gguf > /dev/null 2>&1
warm() { M=$1; shift; timeout 240 env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 \
  --repetitions 1 > $OUT/w_${M}_$RANDOM.log 2>&1; }
log "compile q15 x4, q05 x1"
P=""
for v in "q15 $OFF" "q15 $DO" "q15 $DX" "q15 $DXW" "q05 $DXW"; do warm $v & P="$P $!"; done
wait $P
grep -h -E "rror|anic" $OUT/w_* | head -8 | tee -a $S
( wait $SPID; for v in "$OFF" "$DO" "$DX" "$DXW"; do warm q32 $v & done; wait ) > /dev/null 2>&1 &
CPID=$!
ck() { M=$1; shift; log "check $M ($*)"; timeout 200 env "$@" $B cuda-check -m /tmp/$M.gguf -t 16 2>&1 | grep -E "vs|rror" | tee -a $S; }
ck q15 $DXW
ck q15 $DX SPLASH_CUDA_GU_FUSE=0
ck q15 $DXWL SPLASH_CUDA_GU_FUSE=0
ck q05 $DXW
tg() { M=${M:-q15}; timeout ${TO:-150} env "$@" $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens ${PT:-512} \
  --gen-tokens 128 --repetitions ${REPS:-3} 2>&1 | grep -E "^(decode)|rror|anic" | tee -a $S; }
log "q15 warm-up"; REPS=1 tg $OFF
for r in 1 2 3; do
  for v in "$OFF" "$DO" "$DX" "$DXW"; do log "q15 ctx 512, $v [$r]"; tg $v; done
done
log "q15 ctx 16, $OFF"; PT=16 tg $OFF
log "q15 ctx 16, $DXW"; PT=16 tg $DXW
log "spec on/off identity, q15 + q05 draft ($DXW)"
timeout 150 env $DXW $B bench -m /tmp/q15.gguf --device cuda --spec --draft /tmp/q05.gguf --gen-tokens 96 2>&1 | grep -E "identical|rror" | tee -a $S
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
ncu1() { M=$1; SK=$2; shift 2; log "ncu $M one layer ($*)"
timeout 150 env "$@" $NCU --clock-control none --graph-profiling node -k regex:"^(guq|mmvq|qkvq|attention|quant_q8)" \
  --launch-skip $SK --launch-count 16 --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  $B bench -m /tmp/$M.gguf --device cuda --prompt-tokens 16 --gen-tokens 4 --repetitions 1 > $OUT/ncu_$M.csv 2>&1
python3 - $OUT/ncu_$M.csv <<'PY' 2>&1 | tee -a $S
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print(open(sys.argv[1]).read()[-1500:]); sys.exit()
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
    print(f"{k[:30]:30s} {t:8.2f} us {b:8.2f} MB {b / t if t else 0:5.2f} TB/s")
PY
}
ncu1 q15 400 $DXW
wait $CPID
log "q32 compiled"; grep -h -E "rror|anic" $OUT/w_q32* | head -3 | tee -a $S
for r in 1 2; do
  for v in "$OFF" "$DX" "$DXW" "$DXL" "$DXWL"; do log "q32 ctx 512, $v [$r]"; M=q32 REPS=2 TO=200 tg $v; done
done
log "q32 ctx 512, $DO"; M=q32 REPS=2 TO=200 tg $DO
ncu1 q32 1100 $DXWL
log done
