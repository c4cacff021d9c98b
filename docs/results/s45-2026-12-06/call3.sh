# call 3 (carry .gpu/gpt-fast .whl): whichever card comes (after giving the H100 of call 2 back): the fortieth
# session's roofline at 1K on any card (docs/results/s40-2026-12-05/call1.sh, its H200 branch): the decode section,
# the peer in four setups, the pair and the Transformer beside it; it prints the read floor and what 1.2x needs.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
export PYTHONPATH=$PWD
timeout -k 5 540 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
  --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
  2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 "
