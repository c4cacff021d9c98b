# call 5 (carry .gpu/gpt-fast; on call 4's warm machine, the device time left ~440 s): more processes of the pair
# and gpt-fast at 1K, as call 4's second, numbered by the arguments (default 3 4; call 6 ran `call5.sh 5 6`)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
for r in ${@:-3 4}; do
  timeout -k 5 190 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 --systems orthros+gemv,gpt-fast \
    --gpt-fast-dir .gpu/gpt-fast --out "/tmp/roofline-$r" > "$OUT/roofline-$r.log" 2>&1
  echo "roofline $r: exit=$? $(grep -E '^ decode |decode_vs_gpt_fast' "$OUT/roofline-$r.log" | tr -s ' ' | tr '\n' ';')"
done
