# call 3 (carry .whl): the sampling check after the scale fix (the forty-third session's call2_sample.py,
# unchanged), then the two fp32 Triton tests that calls 1 and 2 left running at their limits.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
timeout -k 5 90 python3 docs/results/s43-2026-12-06/call2_sample.py 2>&1 | tee $OUT/sample.log | tail -6
timeout -k 5 360 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 2 -rfE -W ignore --durations 5 \
  "tests/ops/test_triton.py::test_dq_from_ds_gpu[dtype1-fixed]" "tests/ops/test_triton.py::test_hypothesis_gpu[dtype2-varlen_pad]" \
  > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"; tail -12 $OUT/gpu_tests.log
