# Twenty-fifth session: inference change 33's probe (benchmarks/stream_chain.py, CUDA C++), its
# GPU tests, then one process a setting (CELLS=1, 2, ...: the lists below). From the repo root:
# ORTHROS_COMMIT=<sha> OUT=$OUT [CELLS=n] [T_TESTS=s, 0: no tests] bash docs/results/s25-2026-12-04/call.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/call}; mkdir -p "$OUT"
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader; nvcc --version | tail -1; } 2>&1 | tee "$OUT/log"
[ "${T_TESTS:-240}" = 0 ] || timeout -k 5 "${T_TESTS:-240}" python3 -m pytest tests/benchmarks/test_stream_chain.py -m gpu -p no:cacheprovider -rfE -W ignore \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed|skipped)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
grep -E '^(FAILED|ERROR)' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
CELLS1='default|
s12|--stages 12
s28|--stages 28
s4|--stages 4
default_b|'
# call 2 (after --stats and --skip were added)
CELLS2='stats|--stats
skip_math|--stats --skip math
skip_grid|--stats --skip grid
skip_both|--stats --skip both
s28_skip_both|--stats --skip both --stages 28
default|'
# call 4 (batched consumers, segment-major pieces, --order)
CELLS4='contig|--stats
inter|--order interleaved --stats
inter_skip_both|--order interleaved --skip both --stats
contig_skip_both|--skip both --stats
inter_skip_math|--order interleaved --skip math --stats
inter_skip_grid|--order interleaved --skip grid --stats
inter_s12|--order interleaved --stages 12'
# call 5 (no 64-bit division a piece)
CELLS5='contig|--stats
inter|--order interleaved --stats
inter_skip_grid|--order interleaved --skip grid --stats
contig_b|
inter_b|--order interleaved
inter_s12|--order interleaved --stages 12
inter_s28|--order interleaved --stages 28'
# call 6 (each warp its own slots, no shared-memory atomics)
CELLS6='contig|--stats
inter|--order interleaved --stats
contig_b|
inter_b|--order interleaved
inter_s16|--order interleaved --stages 16
inter_s26|--order interleaved --stages 26'
# call 7 (eight pieces a batch, the sums by halving exchanges)
CELLS7='contig|--stats
inter|--order interleaved --stats
contig_b|
inter_b|--order interleaved
contig_s16|--stages 16'
# call 8 (a batch's stages tested back to back, one arrive a warp)
CELLS8='contig|--stats
contig_b|
inter_b|--order interleaved
contig_s16|--stages 16
contig_skip_math|--skip math --stats'
# call 9 (each stage released once its warp has read it) with the GPU tests
CELLS9='contig_s16|--stages 16 --stats
contig|
contig_s16_b|--stages 16
inter_s16|--order interleaved --stages 16
contig_s16_skip_math|--stages 16 --skip math --stats'
# call 11 (--math mma: the products on tensor cores) with the GPU tests
CELLS11='mma|--math mma --stats
cores|
mma_b|--math mma
mma_inter|--math mma --order interleaved
mma_s24|--math mma --stages 24'
case "${CELLS:-1}" in 2) LIST=$CELLS2 ;; 4) LIST=$CELLS4 ;; 5) LIST=$CELLS5 ;; 6) LIST=$CELLS6 ;; 7) LIST=$CELLS7 ;;
  8) LIST=$CELLS8 ;; 9) LIST=$CELLS9 ;; 11) LIST=$CELLS11 ;;
  *) LIST=$CELLS1 ;; esac
i=0
while IFS='|' read -r name args; do
  [ -n "$name" ] || continue
  i=$((i + 1))
  timeout -k 5 "${T_CELL:-90}" python3 benchmarks/stream_chain.py $args --out "$OUT/$i-$name.json" > "$OUT/$i-$name.txt" 2>&1
  echo "$i $name ($args): exit=$? $(date -u +%T)" | tee -a "$OUT/log"
  grep -E ' us a layer|^error|Error|^kernel cycles|^  [a-z-]+ (run|waits)' "$OUT/$i-$name.txt" | tail -n 10 | tee -a "$OUT/log"
done <<<"$LIST"
cp ~/.cache/orthros/stream_chain/*.ptxas.txt "$OUT/" 2>/dev/null
(cd "$OUT" && shopt -s nullglob && f=([0-9]*-*) && [ ${#f[@]} -gt 0 ] && tar czf cells.tgz "${f[@]}" && rm -f "${f[@]}")
