# call 5 (carry .whl): with 322 s of device time left, the smallest useful check of this session's code on CUDA:
# the HF model's GPU tests, the decode op (its argument checks changed; the inline-merge hypothesis cases left out:
# 32-92 s each), the engine with the fused GEMVs and the GEMV op (its eps check moved): 29 tests, eight workers.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
timeout -k 5 200 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 8 -rfEs -W ignore \
  tests/models/test_modeling_gpu.py tests/ops/test_decode.py tests/engine/test_engine_gemv.py tests/ops/test_gemv.py \
  -k "not hypothesis_inline_merge" --durations 8 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | sed 's/.*\] //' | awk '{print $1}' | sort | uniq -c
tail -14 $OUT/gpu_tests.log
