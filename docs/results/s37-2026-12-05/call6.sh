# call 6 = call5.sh with processes 5 and 6, on the same warm machine right after call 5 (~200 s of device time left)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
for r in 5 6; do
  timeout -k 5 190 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 --systems orthros+gemv,gpt-fast \
    --gpt-fast-dir .gpu/gpt-fast --out "/tmp/roofline-$r" > "$OUT/roofline-$r.log" 2>&1
  echo "roofline $r: exit=$? $(grep -E '^ decode |decode_vs_gpt_fast' "$OUT/roofline-$r.log" | tr -s ' ' | tr '\n' ';')"
done
