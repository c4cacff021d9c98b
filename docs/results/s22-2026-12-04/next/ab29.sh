# Prepared in the twenty-second session for the next GPU session (inference change 29 of docs/performance.md):
# an interleaved A/B at 1K of the fused GEMVs' tensor-core depths, one process a setting, the pair only
# (the Transformer's one-row GEMVs are not changed by these rows). VARIANTS: "def" (the built-in table) or the
# name of a JSON file of docs/results/s22-2026-12-04/next/ (rows passed with roofline.py --gemv-configs).
# From the repo root: ORTHROS_COMMIT=<sha> bash docs/results/s22-2026-12-04/next/ab29.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ab29}; mkdir -p "$OUT"; NEXT=docs/results/s22-2026-12-04/next
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name --format=csv,noheader; } 2>&1 | tee "$OUT/log"
i=0
for v in ${VARIANTS-def qkv_st4 qkv_st5 wo_st5 qkv_st5_wo_st5 def qkv_st4 qkv_st5}; do
  i=$((i+1)); D=$OUT/$i-$v; mkdir -p "$D"; cfg=(); [ "$v" = def ] || cfg=(--gemv-configs "$NEXT/$v.json")
  timeout -k 5 "${T_CELL:-60}" python3 benchmarks/roofline.py --sections decode --gemv "${cfg[@]}" \
    --systems "${SYSTEMS:-orthros+gemv}" --contexts 1024 --out "$D" > "$D/log.txt" 2>&1
  echo "$i $v: exit=$? $(grep -E '^decode orthros\+gemv B=1 L=1024: ' "$D/log.txt" | cut -c1-90)" | tee -a "$OUT/log"
  rm -f "$D"/*.tmp*
done
python3 benchmarks/ab_summary.py "$OUT" --base def 2>&1 | tee -a "$OUT/log"
(cd "$OUT" && shopt -s nullglob && d=([0-9]*-*) && [ ${#d[@]} -gt 0 ] && tar czf runs.tgz "${d[@]}" && rm -rf "${d[@]}")
