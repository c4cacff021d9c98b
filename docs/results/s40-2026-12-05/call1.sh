# call 1 (carry .gpu/gpt-fast): whichever card comes.
# On an H200: the thirty-eighth session's next_call (the roofline's decode section at 1K, the peer in four setups, the
# pair and the Transformer beside it; it prints the read floor and what 1.2x needs; ~420 s).
# On anything else: the window kernels' candidate variants at the real block sizes, the GPU tests never run since
# the tenth session (performance.md, "What is left" item 3), three workers (twelve ran out of memory in the tenth).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name" | tee $OUT/card.log
case "$name" in
  *H200*)
    timeout -k 5 540 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *)
    timeout -k 5 560 python3 -m pytest -p no:cacheprovider -o addopts="" -q -m gpu -n 3 -rfE -W ignore \
      tests/ops/test_triton.py -k "rel_masks_gpu or forward_variants_gpu or dq_gqa_variant_gpu" --durations 25 \
      2>&1 | tee $OUT/gpu_tests.log | tail -45 ;;
esac
