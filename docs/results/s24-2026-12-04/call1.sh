# Prepared in the twenty-third session for the next GPU session (inference change 31 of docs/performance.md):
# the probe of change 30 with weight tiles held in registers across each dependency (--hold), one process a
# setting (36 layers; the engine's GEMV chain, one launch a GEMV, one persistent launch), after the probe's GPU
# tests. From the repo root: ORTHROS_COMMIT=<sha> OUT=$OUT bash docs/results/s23-2026-12-04/next/ab31.sh (~4 min).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ab31}; mkdir -p "$OUT"
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name --format=csv,noheader; } 2>&1 | tee "$OUT/log"
timeout -k 5 "${T_TESTS:-180}" python3 -m pytest tests/benchmarks/test_persistent_chain.py tests/benchmarks/test_inference.py \
  -m gpu -p no:cacheprovider -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
grep -E '^(FAILED|ERROR)' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
i=0
S="--systems engine,launch,persistent --defer"
while IFS='|' read -r name args; do
  [ -n "$name" ] || continue
  i=$((i + 1))
  timeout -k 5 "${T_CELL:-75}" python3 benchmarks/persistent_chain.py $S $args --out "$OUT/$i-$name.json" > "$OUT/$i-$name.txt" 2>&1
  echo "$i $name ($args): exit=$? $(date -u +%T)" | tee -a "$OUT/log"
  grep -E ' us a layer|^error' "$OUT/$i-$name.txt" | tee -a "$OUT/log"
done <<'CELLS'
st6|--stages 6
st6_h2|--stages 6 --hold 2
st6_h4|--stages 6 --hold 4
p256|--programs 256 --block-n 8 --warps 4
p256_h2|--programs 256 --block-n 8 --warps 4 --hold 2
p256_h4|--programs 256 --block-n 8 --warps 4 --hold 4
st6b|--stages 6
st6_h4b|--stages 6 --hold 4
CELLS
(cd "$OUT" && shopt -s nullglob && f=([0-9]*-*) && [ ${#f[@]} -gt 0 ] && tar czf cells.tgz "${f[@]}" && rm -f "${f[@]}")
