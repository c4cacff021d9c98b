# call 6 (call 5's warm machine, ~170 s of device time left): the pair's 1K step with every GEMV's weight loads
# evict_first (ORTHROS_GEMV_EVICT_FIRST=1) against the default, one process each, interleaved 0 1 0 1 while time lasts
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
end=$((SECONDS + 140))
for ef in 0 1 0 1; do
  [ $((end - SECONDS)) -lt 40 ] && break
  ORTHROS_GEMV_EVICT_FIRST=$ef timeout -k 5 $((end - SECONDS)) python3 benchmarks/roofline.py --sections decode --gemv \
    --contexts 1024 --systems orthros+gemv --out /tmp/ef-$ef-$SECONDS > /tmp/ef.log 2>&1
  echo "evict_first=$ef exit=$? $(grep -E '^ decode ' /tmp/ef.log | tr -s ' ')"
done
