#!/usr/bin/env bash
# Issue #18, the decode step's next GPU call (docs/performance.md "The next GPU session", steps 1-2),
# on one H200 in < 600 s: the GPU tests of the decode kernel, the GEMV and the engine with the GEMV;
# then the plain GEMV sweep (every form at M = 1 and 2, the deferred form of change 12 among them)
# and the fused-site sweep. Everything lands in $OUT (logs and the two results.json). Nothing is
# installed: the image's torch / triton run it. From the repo root (the `run` tool, no carry):
#   command: ORTHROS_COMMIT=<sha> bash benchmarks/decode_gpu.sh
# Optional time limits (s): T_TESTS (150), T_SWEEP (200), T_FUSED (200).
set -u
OUT=${OUT:-/tmp/decode-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
T_TESTS=${T_TESTS:-150} T_SWEEP=${T_SWEEP:-200} T_FUSED=${T_FUSED:-200}
{ date -u; echo "commit $ORTHROS_COMMIT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/log"
timeout -k 10 "$T_TESTS" python3 -m pytest tests/ops/test_decode.py tests/ops/test_gemv.py tests/ops/test_gemv_fused.py \
  tests/engine/test_engine_gemv.py -m gpu -n 8 -p no:cacheprovider -q -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
timeout -k 10 "$T_SWEEP" python3 benchmarks/gemv.py --sweep --deadline-s $((T_SWEEP - 40)) \
  --out "$OUT/gemv_sweep.json" > "$OUT/gemv_sweep.log" 2>&1
echo "gemv --sweep: exit=$?" | tee -a "$OUT/log"
timeout -k 10 "$T_FUSED" python3 benchmarks/gemv.py --fused --sweep --deadline-s $((T_FUSED - 40)) \
  --out "$OUT/gemv_fused.json" > "$OUT/gemv_fused.log" 2>&1
echo "gemv --fused --sweep: exit=$?" | tee -a "$OUT/log"
grep -v "it/s" "$OUT/gemv_sweep.log" | tail -n 30
grep -v "it/s" "$OUT/gemv_fused.log" | tail -n 30
