# call 2 (carry .gpu .whl): the `gpu` tests of tests/ops outside test_triton.py (decode ops changed in s53: strided
# lens / norm weights made contiguous, NumPy integers), tests/engine and tests/models.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
bash docs/results/s54-2026-12-07/tests.sh ${LIMIT:-540} "tests/ops/test_decode.py tests/ops/test_gemv.py tests/ops/test_gemv_fused.py tests/ops/test_launch.py tests/ops/test_gdn.py tests/engine tests/models"
