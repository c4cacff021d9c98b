# Twenty-third session, call 1: inference change 29's prepared A/B (ab29.sh, the tensor-core GEMVs'
# depth, one process a setting at 1K, the pair), then processes of the pair and gpt-fast at 1K while
# the call has time left (each needs ~100 s; stop starting them after T_STOP s of the call).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/c1}; mkdir -p "$OUT/ab29"; T0=$(date +%s)
OUT=$OUT/ab29 bash docs/results/s22-2026-12-04/next/ab29.sh
r=0
while [ $(( $(date +%s) - T0 )) -lt "${T_STOP:-430}" ]; do
  r=$((r + 1)); R=$OUT/peer-$r; mkdir -p "$R"
  timeout -k 5 "${T_ROOF:-110}" python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
    --systems orthros+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --out "$R" > "$R/log.txt" 2>&1
  echo "peer $r: exit=$? $(date -u +%T)" | tee -a "$OUT/log"
  grep -E '^decode |vs gpt-fast|gpt-fast' "$R/log.txt" | grep -v "it/s" | cut -c1-140 | tail -n 4 | tee -a "$OUT/log"
  rm -f "$R"/*.tmp "$R"/*.tmp.png "$R"/*.png
done
(cd "$OUT" && shopt -s nullglob && d=(peer-*) && [ ${#d[@]} -gt 0 ] && tar czf peers.tgz "${d[@]}" && rm -rf "${d[@]}")
