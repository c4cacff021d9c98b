# Twenty-second session, call 4: the GPU tests of tests/engine at HEAD, then N processes of the pair and gpt-fast at 1K.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/c4}; mkdir -p "$OUT"
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name --format=csv,noheader; } 2>&1 | tee "$OUT/log"
timeout -k 10 "${T_TESTS:-130}" python3 -m pytest tests/engine -m gpu -n 6 -p no:cacheprovider -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
grep -E '^(FAILED|ERROR)' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
for r in $(seq 1 "${N:-3}"); do
  R=$OUT/peer-$r; mkdir -p "$R"
  timeout -k 5 "${T_ROOF:-80}" python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
    --systems orthros+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --out "$R" > "$R/log.txt" 2>&1
  echo "peer $r: exit=$? $(date -u +%T)" | tee -a "$OUT/log"
  grep -E '^decode |vs gpt-fast|gpt-fast' "$R/log.txt" | grep -v "it/s" | cut -c1-140 | tail -n 4 | tee -a "$OUT/log"
  rm -f "$R"/*.tmp "$R"/*.tmp.png
done
