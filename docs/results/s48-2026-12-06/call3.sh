# call 3 (carry .gpu/gpt-fast .whl): whichever card comes. On an H200: the fortieth session's roofline at 1K. On
# anything else: the `gpu`-marked tests at this session's code (the decode ops' backend rule and window cap, the
# remote code's try-wrapped imports and its new CUDA test, the models' cu_seqlens check), less the window candidates
# and the seven fp32 Triton backward cases (no kernel changed).
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
    timeout -k 5 500 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 6 -rfEs -W ignore tests \
      -k "not rel_masks_gpu and not forward_variants_gpu and not dq_gqa_variant_gpu and not (test_dq_from_ds_gpu and dtype1) and not (test_hypothesis_gpu and dtype2)" \
      --durations 15 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
    grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | sed 's/.*\] //' | awk '{print $1}' | sort | uniq -c
    tail -25 $OUT/gpu_tests.log ;;
esac
