# call 1 (carry .gpu/gpt-fast): on an H200, the fortieth session's roofline at 1K (the decode section, the pair, the
# Transformer and the peer's fastest of four setups; it prints the read floor and what 1.2x needs; ~420 s). On
# anything else only the card's name: every H100 figure this call could take was taken at the same decode code in the
# forty-eighth session, so the device time is kept for another try at an H200.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
case "$name" in
  *H200*)
    timeout -k 5 540 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *) echo "not an H200: nothing run" ;;
esac
