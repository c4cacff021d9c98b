# call 1 (carry .whl): whichever card comes. The CUDA checks of the last two sessions' host-side changes (the
# sampling fix 8aa39e8, the engine's GDN continuation rework d1571e6) and of this session's: call4_sample.py, then
# the engine's and the models' GPU tests. (The H200 roofline at 1K, ~420 s, no longer fits the device time left
# after this session's failed starts.)
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
timeout -k 5 100 python3 docs/results/s41-2026-12-05/call4_sample.py 2>&1 | tee $OUT/sample.log | tail -5
timeout -k 5 320 python3 -m pytest -p no:cacheprovider -o addopts="" -q -n 6 -rfEs -W ignore \
  tests/engine tests/models/test_modeling_gpu.py --durations 10 2>&1 | tee $OUT/gpu_tests.log | tail -40
