# call 4 (carry .whl): the last 249 s of device time. The one `gpu` test outside the window candidates that did
# not run this session (test_gpu_training_shapes[True-dtype0]), and the sampling check at this commit (the
# scale's second clamp, adb763c, came after call 3).
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
export PYTHONPATH=$PWD
timeout -k 5 60 python3 docs/results/s43-2026-12-06/call2_sample.py 2>&1 | tee $OUT/sample.log | tail -6
timeout -k 5 100 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -rfE -W ignore --durations 3 \
  "tests/ops/test_triton.py::test_gpu_training_shapes[True-dtype0]" > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
tail -8 $OUT/gpu_tests.log
