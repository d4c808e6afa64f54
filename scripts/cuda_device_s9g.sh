#!/bin/bash
# Stretch-9 device call G: the rows' loads through one helper (row_load) in argmax_rows / topk_rows, checked
# (cuda-check: picks, probabilities, largest logits), decode speed, and where the GPU waits between decode steps
# (nsys: the gap between one step's last kernel and the next step's first, i.e. the host's turn). Binary in $D.
set -u
R=$(pwd); D=${D:-$R/.dev/cuda/s9}; B=$D/splash; OUT=${OUT:-$R/cuda-out}; mkdir -p $OUT
export SPLASH_HOME=${SPLASH_HOME:-/tmp/splash-home}; mkdir -p $SPLASH_HOME
S=$OUT/summary.txt
log() { echo "== [$SECONDS s] $*" | tee -a $S; }
$B synth --like qwen2.5-coder-1.5b -o /tmp/q15.gguf > /dev/null 2>&1
log "compile q15"
timeout 240 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 16 --gen-tokens 2 --repetitions 1 2>&1 | grep -E "rror|anic|load" | tee -a $S
log "check q15"; timeout 200 $B cuda-check -m /tmp/q15.gguf -t 16 2>&1 | grep -E "device|batched|decode \(|FAIL|PASS|rror|anic" | tee -a $S
for c in 0 84; do
  echo "q15 ctx 512, candidates $c: $(timeout 100 $B bench -m /tmp/q15.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --repetitions 3 --candidates $c 2>&1 | grep -E '^decode|rror')" | tee -a $S
done
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
log "nsys ($NSYS): gaps between decode steps"
if [ -n "$NSYS" ]; then
  timeout 150 $NSYS profile -t cuda --cuda-graph-trace=node -o /tmp/prof -f true $B bench -m /tmp/q15.gguf --device cuda \
    --prompt-tokens 512 --gen-tokens 64 --repetitions 1 > $OUT/nsys.log 2>&1
  timeout 100 $NSYS stats -r cuda_gpu_trace -f csv -o /tmp/trace /tmp/prof.nsys-rep > /dev/null 2>&1
  F=$(ls /tmp/trace*.csv 2>/dev/null | head -1)
  head -2 "$F" | cut -c1-300 | tee -a $S
  # Columns: Start (ns), Duration (ns), ..., Name last. A decode step runs from its HtoD copies through embed ...
  # argmax_rows; its host turn is from one argmax_rows' end to the next embed's start (copies included), and the
  # in-step gaps are the idle time between the step's kernels.
  awk -F, 'NR>1 { s=$1; d=$2; n=$NF;
      if (n ~ /embed/ && ae > 0) { t=s-ae; tt+=t; nt++; if (t>mx) mx=t; instep=1; pe=s+d; next }
      if (instep && n !~ /memcpy|memset/) { if (s>pe) ig+=s-pe; if (s+d>pe) pe=s+d }
      if (n ~ /argmax_rows/) { ae=s+d; instep=0 } }
    END { if (nt) printf "steps %d: host turn (argmax end to next embed start) mean %.1f us, max %.1f us; idle between kernels inside a step %.1f us per step\n", nt, tt/nt/1000, mx/1000, ig/nt/1000 }' "$F" | tee -a $S
fi
log done
