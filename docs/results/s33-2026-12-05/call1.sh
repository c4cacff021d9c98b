# call 1 (inference changes 37-39): GPU tests of both preload forms with the split kernel's stages
# fitted and two pieces a consumer step, then the A/B at 1K; supersedes docs/results/s32-2026-12-05/call1.sh
set -u; export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
mkdir -p $OUT; { date -u; nvcc --version | tail -1; } | tee $OUT/log
python3 -c "from orthros.ops.gemv import preload; print(preload.build())" >> $OUT/log 2>&1  # built once, before the tests
T="tests/engine/test_engine_gemv.py tests/engine/test_decode_qkv_kernel.py -m gpu -p no:cacheprovider -rfE -W ignore"
ORTHROS_GEMV_PRELOAD=20 timeout -k 5 150 python3 -m pytest tests/ops/test_gemv_preload.py tests/engine/test_engine_preload.py \
  tests/ops/test_decode.py::test_gpu_qkv_kernel_at_fitted_stages_matches_reference $T -n 4 > $OUT/tests_plain.log 2>&1 &
ORTHROS_GEMV_PRELOAD=20 ORTHROS_GEMV_PRELOAD_MERGE=1 timeout -k 5 150 python3 -m pytest $T -n 3 > $OUT/tests_merge.log 2>&1
wait
for f in plain merge; do echo "gpu tests ($f): $(grep -E '[0-9]+ (passed|failed)' $OUT/tests_$f.log | tail -1)" | tee -a $OUT/log
  grep -E '^(FAILED|ERROR)' $OUT/tests_$f.log | head -10 | tee -a $OUT/log; done
grep -hE "registers|spill" ~/.cache/orthros/kernels/preload-*.ptxas.txt | sort | uniq -c | head -6 | tee -a $OUT/log
OUT=$OUT/ab TESTS=0 CONTEXTS=1024 T_CELL=60 \
  VARIANTS="${VARIANTS:-pf4m2 pf4m2wp12 pf4m2wp20 pf4m2wp20g1 pf4m2wp12m pf4m2wp20m pf4m2fit pf4m2}" \
  bash benchmarks/pdl_gpu.sh 2>&1 | tail -30
