# Twenty-third session, call 4: the GPU tests of tests/engine (cut by their limit in the twenty-second
# session's call 4), then processes of the pair and gpt-fast at 1K while the call has time left.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/c4}; mkdir -p "$OUT"; T0=$(date +%s)
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name --format=csv,noheader; } 2>&1 | tee "$OUT/log"
timeout -k 10 "${T_TESTS:-230}" python3 -m pytest tests/engine -m gpu -n 8 -p no:cacheprovider -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1) $(date -u +%T)" | tee -a "$OUT/log"
grep -E '^(FAILED|ERROR)' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
r=0
while [ $(( $(date +%s) - T0 )) -lt "${T_STOP:-440}" ]; do
  r=$((r + 1)); R=$OUT/peer-$r; mkdir -p "$R"
  timeout -k 5 "${T_ROOF:-110}" python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
    --systems orthros+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --out "$R" > "$R/log.txt" 2>&1
  echo "peer $r: exit=$? $(date -u +%T)" | tee -a "$OUT/log"
  grep -E '^ decode |decode_vs_gpt_fast' "$R/log.txt" | cut -c1-140 | tee -a "$OUT/log"
  rm -f "$R"/*.tmp "$R"/*.tmp.png "$R"/*.png
done
(cd "$OUT" && shopt -s nullglob && d=(peer-*) && [ ${#d[@]} -gt 0 ] && tar czf peers.tgz "${d[@]}" && rm -rf "${d[@]}")
