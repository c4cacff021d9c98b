# call 2 (carry .gpu .whl): the `gpu` tests call 1 did not run. After an H200 roofline: tests/ops and tests/engine
# (as call 1 on another card); after them: tests/models, tests/benchmarks (32).
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
bash docs/results/s52-2026-12-07/tests.sh ${LIMIT:-520} "${FOLDERS:?}"
