# call 1 (carry .gpu/gpt-fast, .whl): whichever card comes.
# On an H200: the fortieth session's call (the roofline's decode section at 1K, the peer in four setups; ~420 s).
# On anything else: the CUDA checks of the last two sessions' host-side changes (the sampling fix 8aa39e8, the
# engine's GDN continuation rework d1571e6): call4_sample.py, then the engine's and the models' GPU tests.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
case "$name" in
  *H200*)
    timeout -k 5 540 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *)
    timeout -k 5 100 python3 docs/results/s41-2026-12-05/call4_sample.py 2>&1 | tee $OUT/sample.log | tail -5
    timeout -k 5 320 python3 -m pytest -p no:cacheprovider -o addopts="" -q -n 6 -rfEs -W ignore \
      tests/engine tests/models/test_modeling_gpu.py --durations 10 2>&1 | tee $OUT/gpu_tests.log | tail -40 ;;
esac
