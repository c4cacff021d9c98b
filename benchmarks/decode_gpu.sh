#!/usr/bin/env bash
# Issue #18, target 1 (decode B=1) in one GPU call of < 600 s on one H200 (docs/performance.md
# "The next GPU session"): the GPU tests of the GEMV, the fused GEMV and the engine with it; then the
# fused-site sweep at the Orthros pair's M = 2 (every form, the deferred one of change 12 among
# them), whose winners become CONFIGS rows (meta.tuned_rows); then the roofline's decode section with --gemv run with exactly those rows (--gemv-configs), against the
# same-run HBM floor and gpt-fast. Everything lands in $OUT. Nothing is installed: the image's
# torch / triton run it. From the repo root (the `run` tool):
#   command: ORTHROS_COMMIT=<sha> bash benchmarks/decode_gpu.sh        carry: [".gpu/gpt-fast"]
# Optional time limits (s): T_TESTS (90), T_FUSED (200), T_ROOF (270); M (the sweep's rows, 2).
# The sweep takes the sites by their share of a step (gate/up, down, QKV, o), so a deadline cuts the
# smallest; a site without a tuned row keeps the built-in table's config.
set -u
OUT=${OUT:-/tmp/decode-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
T_TESTS=${T_TESTS:-90} T_FUSED=${T_FUSED:-200} T_ROOF=${T_ROOF:-270} M=${M:-2}
GPT_FAST=${GPT_FAST:-.gpu/gpt-fast}
{ date -u; echo "commit $ORTHROS_COMMIT"; cat "$GPT_FAST/UPSTREAM" 2>/dev/null
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/log"
timeout -k 10 "$T_TESTS" python3 -m pytest tests/ops/test_gemv.py tests/ops/test_gemv_fused.py tests/engine/test_engine_gemv.py \
  -m gpu -n 8 \
  -p no:cacheprovider -q -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
grep -E '^(FAILED|ERROR)' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
timeout -k 10 "$T_FUSED" python3 benchmarks/gemv.py --fused --sweep --m "$M" --deadline-s $((T_FUSED - 25)) \
  --sites norm_gate_up,silu_down_res,norm_qkv,o_res \
  --out "$OUT/gemv_fused.json" > "$OUT/gemv_fused.log" 2>&1
echo "gemv --fused --sweep --m $M: exit=$?" | tee -a "$OUT/log"
grep -v "it/s" "$OUT/gemv_fused.log" | tail -n 40 | tee -a "$OUT/log"
ROOF_OUT=$OUT/roofline; mkdir -p "$ROOF_OUT"
GEMV_CFG=()
if python3 -c "import json,sys; sys.exit(0 if json.load(open('$OUT/gemv_fused.json'))['meta'].get('tuned_rows') else 1)" \
    2>/dev/null; then
  GEMV_CFG=(--gemv-configs "$OUT/gemv_fused.json")
else
  echo "no tuned rows: the roofline runs the built-in CONFIGS" | tee -a "$OUT/log"
fi
timeout -k 10 "$T_ROOF" python3 benchmarks/roofline.py --gpt-fast-dir "$GPT_FAST" --sections decode --gemv \
  "${GEMV_CFG[@]}" --deadline-s $((T_ROOF - 30)) --out "$ROOF_OUT" > "$ROOF_OUT/log.txt" 2>&1
echo "roofline decode --gemv: exit=$?" | tee -a "$OUT/log"
rm -f "$ROOF_OUT"/*.tmp "$ROOF_OUT"/*.tmp.png
grep -v "it/s\|it \[" "$ROOF_OUT/log.txt" | tail -n 45
