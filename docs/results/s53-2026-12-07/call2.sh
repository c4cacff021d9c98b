# call 2 (carry .gpu .whl), chained while call 1's machine is warm: the `gpu` tests of the folders in FOLDERS, cut at
# LIMIT seconds (after an H200 roofline: tests/engine tests/models; after those: tests/ops/test_triton.py, whose
# float32 backward sweeps the fifty-second session's call was cut before).
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
bash docs/results/s53-2026-12-07/tests.sh ${LIMIT:-520} "${FOLDERS:?}"
