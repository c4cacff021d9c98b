# call 4 (carry .whl): call 3 could not start (five tries, 12:37-13:31 UTC, each failed start taking device time),
# so with ~500 s of device time left: the `gpu` tests of what this session changed, whichever card comes: the
# models, the engine, the layers, the decode op and the GEMVs (54 tests; the longest ran 172 s in the forty-fifth
# session), eight workers.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
timeout -k 5 380 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 8 -rfEs -W ignore \
  tests/models tests/engine tests/ops/test_decode.py tests/ops/test_gemv.py tests/ops/test_gemv_fused.py tests/layers \
  --durations 10 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | sed 's/.*\] //' | awk '{print $1}' | sort | uniq -c
tail -20 $OUT/gpu_tests.log
