# call 1 (carry .gpu .whl), whichever card comes. On an H200: the 1K decode roofline of issue #18 (the pair, the
# Transformer, the peer's fastest of four gpt-fast setups), one more process of this decode code. On anything
# else: the `gpu` tests of tests/engine and tests/models (28), not run on a GPU since the forty-ninth session's code.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
case "$name" in
  *H200*)
    timeout -k 5 300 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *)
    bash docs/results/s53-2026-12-07/tests.sh ${LIMIT:-520} "tests/engine tests/models" ;;
esac
