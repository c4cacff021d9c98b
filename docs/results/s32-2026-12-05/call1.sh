# call 1 (inference change 37): GPU tests with the preload on, then the A/B at 1K and a timeline
set -u; export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
mkdir -p $OUT; nvcc --version | tail -1 | tee $OUT/log
ORTHROS_GEMV_PRELOAD=12 timeout -k 5 130 python3 -m pytest tests/ops/test_gemv_preload.py tests/engine/test_engine_gemv.py \
  tests/engine/test_decode_qkv_kernel.py -m gpu -n 6 -p no:cacheprovider -rfE -W ignore > $OUT/gpu_tests.log 2>&1
echo "gpu tests (ORTHROS_GEMV_PRELOAD=12): exit=$? $(grep -E '[0-9]+ (passed|failed)' $OUT/gpu_tests.log | tail -1)" | tee -a $OUT/log
grep -E '^(FAILED|ERROR)' $OUT/gpu_tests.log | head -20 | tee -a $OUT/log
cat ~/.cache/orthros/kernels/preload-*.ptxas.txt 2>/dev/null | grep -E "registers|spill" | head -4 | tee -a $OUT/log
OUT=$OUT/ab TESTS=0 CONTEXTS=1024 T_CELL=70 T_PROFILE=90 VARIANTS="pf4m2 pf4m2wp12 pf4m2wp12late pf4m2 pf4m2wp12" \
  PROFILE="pf4m2wp12" bash benchmarks/pdl_gpu.sh 2>&1 | tail -40
