# Twenty-third session, calls 2 and 3 (CELLS=3: call 3's settings, the deferred form): inference change 30's probe (benchmarks/persistent_chain.py): its GPU
# test, then one process a setting (the engine's GEMV chain, one launch a GEMV, one persistent launch,
# cuBLAS; 36 layers of Qwen3-8B's four GEMVs at M = 2).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/c2}; mkdir -p "$OUT"
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name --format=csv,noheader; } 2>&1 | tee "$OUT/log"
timeout -k 5 "${T_TESTS:-150}" python3 -m pytest tests/benchmarks/test_persistent_chain.py -m gpu -p no:cacheprovider \
  -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
grep -E '^(FAILED|ERROR)|Error' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
i=0
while IFS='|' read -r name args; do
  [ -n "$name" ] || continue
  i=$((i + 1))
  timeout -k 5 "${T_CELL:-75}" python3 benchmarks/persistent_chain.py $args --out "$OUT/$i-$name.json" > "$OUT/$i-$name.txt" 2>&1
  echo "$i $name ($args): exit=$? $(date -u +%T)" | tee -a "$OUT/log"
  grep -E ' us a layer|^error' "$OUT/$i-$name.txt" | tee -a "$OUT/log"
done < <(if [ "${CELLS:-2}" = 3 ]; then cat <<'CELLS3'
d|--defer
d_pf0|--defer --prefetch-mb 0 --systems engine,launch,persistent
d_bk256w4|--defer --block-k 256 --warps 4 --systems engine,launch,persistent
d_p256|--defer --programs 256 --block-n 8 --block-k 1024 --systems engine,launch,persistent
d_p256w4|--defer --programs 256 --block-n 8 --block-k 512 --warps 4 --systems engine,launch,persistent
d_st6|--defer --stages 6 --systems engine,launch,persistent
d_pf8|--defer --prefetch-mb 8 --systems engine,launch,persistent
def|--systems engine,launch,persistent
d2|--defer --systems engine,launch,persistent
CELLS3
else cat <<'CELLS'
def|
pf0|--prefetch-mb 0 --systems engine,launch,persistent
st6|--stages 6 --systems engine,launch,persistent
bk256|--block-k 256 --warps 4 --systems engine,launch,persistent
p64|--programs 64 --systems engine,launch,persistent
p256|--programs 256 --block-n 8 --block-k 1024 --systems engine,launch,persistent
def2|--systems engine,launch,persistent
CELLS
fi)
(cd "$OUT" && shopt -s nullglob && f=([0-9]*-*) && [ ${#f[@]} -gt 0 ] && tar czf cells.tgz "${f[@]}" && rm -f "${f[@]}")
