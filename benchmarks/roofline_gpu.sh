#!/usr/bin/env bash
# Issue #18 on one H200: the roofline sweep (benchmarks/roofline.py: decode B=1 vs the HBM floor and
# gpt-fast, batched decode, the window stream vs Flex and its floor), then results.json,
# roofline.png and the log into $OUT. Each new cache shape recompiles gpt-fast with its
# coordinate-descent tuning, ~110 s a cell on the H200 (measured 2026-12-01), so the whole sweep
# takes three calls of < 600 s:
#   SECTIONS=decode,window                                   (gpt-fast at B=1 only at 1K, the target's)
#   SECTIONS=batched EXTRA="--batched-contexts 4096"
#   SECTIONS=batched EXTRA="--batched-contexts 32768"
# then `python benchmarks/roofline.py --plot-only a/results.json b/results.json c/results.json` joins them.
#
# Carried in: the working tree (tracked files) and the ignored folder .gpu/gpt-fast (gpt-fast's
# model.py and UPSTREAM, its commit). The H200 image has torch 2.11, triton 3.6 and no registry:
# nothing is installed. From the repo root, e.g. with the `run` tool:
#   command: ORTHROS_COMMIT=<sha> bash benchmarks/roofline_gpu.sh     carry: [".gpu/gpt-fast"]
# Optional: SECTIONS (default decode,window), T_SWEEP (hard limit, 545 s), DEADLINE (cells stop
# starting at 475 s), RESERVE (the last 120 s before the deadline kept for the window section),
# EXTRA (more flags, e.g. --gpt-fast-contexts all, --no-fuse with GEMV=0), GPT_FAST (gpt-fast's folder; `none`: no peer),
# GEMV (default 1: --gemv, so the engine's default on CUDA, its fused GEMVs, is measured beside the unfused rows;
# 0: without them).
set -u
OUT=${OUT:-/tmp/roofline}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
SECTIONS=${SECTIONS:-decode,window}
T_SWEEP=${T_SWEEP:-545} DEADLINE=${DEADLINE:-475} RESERVE=${RESERVE:-120}
GPT_FAST=${GPT_FAST:-.gpu/gpt-fast}
{ date -u; echo "commit $ORTHROS_COMMIT"; cat "$GPT_FAST/UPSTREAM" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$OUT/log"

PEER=(--gpt-fast-dir "$GPT_FAST")
[ "$GPT_FAST" = none ] && PEER=()  # GPT_FAST=none: the engine's systems only (no ~110 s gpt-fast compiles)
GEMV_FLAG=(--gemv); [ "${GEMV:-1}" = 0 ] && GEMV_FLAG=()
timeout -k 10 "$T_SWEEP" python3 benchmarks/roofline.py "${PEER[@]}" "${GEMV_FLAG[@]}" --sections "$SECTIONS" \
  --deadline-s "$DEADLINE" --window-reserve-s "$RESERVE" --out "$OUT" ${EXTRA:-} 2>&1 | tee -a "$OUT/log"
status=${PIPESTATUS[0]}
if [ "$status" = 124 ] || [ "$status" = 137 ]; then
  echo "exit=$status: killed at ${T_SWEEP} s; results.json holds every row measured before" | tee -a "$OUT/log"
else
  echo "exit=$status" | tee -a "$OUT/log"
fi
rm -f "$OUT"/*.tmp "$OUT"/*.tmp.png
if [ ! -s "$OUT/roofline.png" ] && [ -s "$OUT/results.json" ]; then  # killed before the plot: draw it now
  python3 benchmarks/roofline.py --plot-only "$OUT/results.json" --out "$OUT" 2>&1 | tail -n 60 | tee -a "$OUT/log"
fi
ls -la "$OUT"
exit "$status"
