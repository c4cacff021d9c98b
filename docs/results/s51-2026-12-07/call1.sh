# call 1 (carry .gpu .whl), whichever card comes, sized to the 430 device-seconds this session was lent (a start
# costs a minute or more). On an H200: the 1K decode roofline (the pair, the Transformer, the peer's fastest of four
# setups; the forty-fifth session's cells took 2-10 s, 2-4 s and 56-160 s). On anything else: the `gpu`-marked
# tests of the decode / GEMV / reference ops and the engine (the fiftieth session's fixes that touch the GPU path).
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
case "$name" in
  *H200*)
    timeout -k 5 270 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *)
    timeout -k 5 240 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 6 -rfEs -W ignore \
      tests/ops/test_decode.py tests/ops/test_gemv.py tests/ops/test_gemv_fused.py tests/ops/test_reference.py \
      tests/engine --durations 10 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
    grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | sed 's/.*\] //' | awk '{print $1}' | sort | uniq -c
    tail -25 $OUT/gpu_tests.log ;;
esac
