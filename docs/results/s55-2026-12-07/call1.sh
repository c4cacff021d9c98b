# call 1 (carry .gpu .whl), whichever card comes. On an H200: the 1K decode roofline of issue #18 (one more process of
# this decode code), then the decode-op and engine `gpu` tests. On anything else: the two float32 backward candidates'
# sweeps of tests/ops/test_triton.py that the fifty-fourth session's device time cut, with two workers.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -c "import torch, triton, hypothesis; print(torch.__version__, triton.__version__, hypothesis.__version__)" | tee -a $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
F=tests/ops/test_triton.py
case "$name" in
  *H200*)
    timeout -k 5 280 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 "
    bash docs/results/s54-2026-12-07/tests.sh 250 "tests/ops/test_decode.py tests/engine" ;;
  *)
    timeout -s INT -k 20 ${LIMIT:-520} python3 -m pytest -p no:cacheprovider -o addopts="" -v -n 2 -rfEs --tb=short -W ignore \
      "$F::test_dq_gqa_variant_gpu[dtype1-gqa-True]" "$F::test_dq_gqa_variant_gpu[dtype1-edge-True]" \
      --durations 2 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
    grep -E " (PASSED|FAILED|ERROR|SKIPPED)" $OUT/gpu_tests.log | grep -oE "(PASSED|FAILED|ERROR|SKIPPED)" | sort | uniq -c
    grep -E "^(E |FAILED|ERROR)" $OUT/gpu_tests.log | cut -c1-300 | head -30; tail -8 $OUT/gpu_tests.log ;;
esac
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
