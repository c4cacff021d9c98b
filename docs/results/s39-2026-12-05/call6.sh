# call 6 (carry .gpu/gpt-fast): only on an H200 (any other card exits at once): the roofline at 1K with the read
# ceiling, the pair and the peer in two setups (~200 s; what the session's device time left allows)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name"
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
timeout -k 5 260 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
  --systems orthros+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 2 --out $OUT/roofline \
  2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 "
