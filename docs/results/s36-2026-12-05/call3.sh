# call 3 (14:11 UTC, the same warm machine; carry .gpu/gpt-fast): four more processes of the pair and gpt-fast at 1K
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=80dd532
for r in 4 5 6 7; do
  R=$OUT/roofline-$r; mkdir -p "$R"
  timeout -k 5 150 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 --systems orthros+gemv,gpt-fast \
    --gpt-fast-dir .gpu/gpt-fast --out "$R" > "$R/log.txt" 2>&1
  echo "process $r exit=$?"; grep -E "^ decode |decode_vs_gpt_fast|^# issue 18" "$R/log.txt"
done 2>&1 | tee "$OUT/more.log"
