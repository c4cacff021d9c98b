# call 2 (carry .gpu .whl): call 1 again, shortened to the 250 device-seconds left after its failed start (what the
# next start leaves is the limit). On an H200: the 1K roofline with the peer's fastest of TWO setups, not four (the
# forty-eighth session's two-setup cell took 85 s on an H100). On anything else: call 1's tests, cut at 150 s.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
case "$name" in
  *H200*)
    timeout -k 5 170 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 2 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *)
    timeout -k 5 150 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 6 -rfEs -W ignore \
      tests/ops/test_decode.py tests/ops/test_gemv.py tests/ops/test_gemv_fused.py tests/ops/test_reference.py \
      tests/engine --durations 10 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
    grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | sed 's/.*\] //' | awk '{print $1}' | sort | uniq -c
    tail -25 $OUT/gpu_tests.log ;;
esac
