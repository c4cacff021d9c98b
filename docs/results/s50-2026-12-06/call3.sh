# call 3 (carry .whl): call 2's tests narrowed to what fits the device time left (~640 s) after four failed starts:
# the `gpu`-marked tests of the files this session's fixes touched (ops: decode, GEMV, GEMV fused, reference, merge,
# GDN; layers; models; engine; the benchmarks' inference sizes), with fla-core 0.6.0 from the carried wheel.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
timeout -k 5 420 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 6 -rfEs -W ignore \
  tests/ops/test_decode.py tests/ops/test_gemv.py tests/ops/test_gemv_fused.py tests/ops/test_reference.py \
  tests/ops/test_merge.py tests/ops/test_gdn.py tests/layers tests/models tests/engine tests/benchmarks/test_inference.py \
  --durations 10 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | sed 's/.*\] //' | awk '{print $1}' | sort | uniq -c
tail -25 $OUT/gpu_tests.log
