# call 1 (carry .gpu/gpt-fast): whichever card comes (asked as nvidia-h200).
# On an H200: the fortieth session's roofline at 1K (docs/results/s40-2026-12-05/call1.sh, its H200 branch).
# On anything else: issue #18 target 2 with the peer at the current decode code, the batched section at 4K
# (B = 8, 32, 64: the pair, the Transformer, gpt-fast; the figure's batched-vs-gpt-fast panel has been empty since
# the peer last ran batched, 2026-12-03 at 8f3680c).
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
(git status --short 2>/dev/null | grep -v '^??' | head -20) | tee -a $OUT/card.log   # the tree against its commit
export PYTHONPATH=$PWD
case "$name" in
  *H200*)
    timeout -k 5 540 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *)
    OUT=$OUT/batched SECTIONS=batched T_SWEEP=560 DEADLINE=500 EXTRA="--batched-contexts 4096" \
      bash benchmarks/roofline_gpu.sh 2>&1 | grep -v -E "Warning|warn_once|it/s|s/it" | tail -60 ;;
esac
