# call 4 (carry .gpu/gpt-fast): the roofline's decode section at 1K with the peer timed in three setups of the
# process (roofline.py --gpt-fast-setups 3: the row is its fastest setup), the pair beside it (~400 s; three setups, not four, to fit the device time left)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 440 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
  --systems orthros+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 3 --out $OUT/roofline \
  2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "decode |setups|decode_vs"
