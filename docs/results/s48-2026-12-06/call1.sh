# call 1 (carry .gpu/gpt-fast): whichever card comes.
# On an H200: the fortieth session's roofline at 1K (the peer in four setups, the pair and the Transformer beside it).
# On anything else: the B = 1 decode section at every context (1K, 4K, 32K, 128K; the pair and the Transformer with
# the engine's fused GEMVs, its CUDA default), gpt-fast at 1K in two setups: target 1's floor part on an H100 at the
# current decode code (benchmarks.md has it only from H200 runs).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
case "$name" in
  *H200*)
    timeout -k 5 540 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *)
    timeout -k 5 560 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024,4096,32768,131072 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-contexts 1024 \
      --gpt-fast-setups 2 --deadline-s 500 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|floor" ;;
esac
