# Twenty-sixth session: why change 33's consumers fall behind its weight stream. From the repo root:
# ORTHROS_COMMIT=<sha> OUT=$OUT [NCU="name|args ..."] [CELLS="name|args ..."] bash docs/results/s26-2026-12-04/call.sh
# NCU: one line a profile of stream_chain.py's kernel under Nsight Compute (full set, no clock control,
# --layers 8); CELLS: one line a timed process of stream_chain.py (36 layers, every system).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/call}; mkdir -p "$OUT"
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader; nvcc --version | tail -1; uname -r; } 2>&1 | tee "$OUT/log"
NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU_BIN:-none} $($NCU_BIN --version 2>/dev/null | tail -1)" | tee -a "$OUT/log"
mkdir -p "$OUT/p"
while IFS='|' read -r name args; do
  [ -n "$name" ] || continue
  timeout -k 5 "${T_NCU:-150}" "$NCU_BIN" --clock-control none --set full -k regex:stream_chain -c 1 -f -o "$OUT/p/$name" \
    python3 benchmarks/stream_chain.py --systems cuda,torch --layers 8 --reps 2 $args --out "/tmp/ncu-$name.json" > "$OUT/p/$name.run.txt" 2>&1
  echo "ncu $name ($args): exit=$? $(date -u +%T)" | tee -a "$OUT/log"
  tail -n 4 "$OUT/p/$name.run.txt" | tee -a "$OUT/log"
  [ -f "$OUT/p/$name.ncu-rep" ] || continue
  "$NCU_BIN" -i "$OUT/p/$name.ncu-rep" --page details > "$OUT/p/$name.details.txt" 2>&1
  "$NCU_BIN" -i "$OUT/p/$name.ncu-rep" --page raw --csv > "$OUT/p/$name.raw.csv" 2>&1
  "$NCU_BIN" -i "$OUT/p/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/p/$name.sass.csv" 2>&1
  grep -iE "stall|warp cycles per|issued|eligible|active warps" "$OUT/p/$name.details.txt" | head -n 30 | tee -a "$OUT/log"
done <<<"${NCU:-}"
i=0
while IFS='|' read -r name args; do
  [ -n "$name" ] || continue
  i=$((i + 1))
  timeout -k 5 "${T_CELL:-90}" python3 benchmarks/stream_chain.py $args --out "$OUT/p/$i-$name.json" > "$OUT/p/$i-$name.txt" 2>&1
  echo "$i $name ($args): exit=$? $(date -u +%T)" | tee -a "$OUT/log"
  grep -E ' us a layer|^error|Error|^kernel cycles|^  [a-z-]+ (run|waits)' "$OUT/p/$i-$name.txt" | tail -n 10 | tee -a "$OUT/log"
done <<<"${CELLS:-}"
cp ~/.cache/orthros/stream_chain/*.ptxas.txt "$OUT/p/" 2>/dev/null
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
