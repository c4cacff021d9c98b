# Twenty-fourth session, calls 2 and 3: inference change 32's probe (benchmarks/fused_mlp.py), its GPU
# test, then one process a setting (calls 3-7: CELLS=3 .. 7, the lists below). From the repo root:
# ORTHROS_COMMIT=<sha> OUT=$OUT [CELLS=3..7] bash docs/results/s24-2026-12-04/call2.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/call2}; mkdir -p "$OUT"
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name --format=csv,noheader; } 2>&1 | tee "$OUT/log"
timeout -k 5 "${T_TESTS:-150}" python3 -m pytest tests/benchmarks/test_fused_mlp.py -m gpu -p no:cacheprovider -rfE -W ignore \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
grep -E '^(FAILED|ERROR)' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
CELLS2='default|
n128|--block-n 128
k64s4|--block-k 64 --stages 4
s2|--stages 2
bi64|--block-i 64 --block-k 64
w8|--warps 8
pf0|--prefetch-lines 0
default_b|'
# call 3 (after the norm and --no-rotate were added)
CELLS3='default|
norot|--no-rotate
bi64|--block-i 64 --block-k 64
bi64_norot|--block-i 64 --block-k 64 --no-rotate
bi64_n128|--block-i 64 --block-k 64 --block-n 128
k64s4|--block-k 64 --stages 4
bi64_w8|--block-i 64 --block-k 64 --warps 8
bi128|--block-i 128 --block-k 64 --block-n 128'
# call 4 (after --sink was added)
CELLS4='bi64_n128|--block-i 64 --block-k 64 --block-n 128
bi64_n128_store|--block-i 64 --block-k 64 --block-n 128 --sink store
bi64_gate_up|--block-i 64 --block-k 64 --block-n 128 --sink gate_up
bi32_store|--sink store
bi32_gate_up|--sink gate_up
bi64_n64|--block-i 64 --block-k 64 --block-n 64
bi64_n128_s4|--block-i 64 --block-k 64 --block-n 128 --stages 4
bi128_n64|--block-i 128 --block-k 64 --block-n 64'
# call 5 (after --plain was added)
CELLS5='plain_bi64|--plain --block-i 64 --block-k 64 --block-n 128
plain_bi64_k128|--plain --block-i 64 --block-k 128 --block-n 128
plain_bi64_k128_gu|--plain --block-i 64 --block-k 128 --block-n 128 --sink gate_up
plain_bi32_k128|--plain --block-i 32 --block-k 128 --block-n 128
plain_bi32_k128_gu|--plain --block-i 32 --block-k 128 --block-n 128 --sink gate_up
plain_bi128|--plain --block-i 128 --block-k 64 --block-n 128
plain_bi64_s4|--plain --block-i 64 --block-k 64 --block-n 128 --stages 4
bi64_n128|--block-i 64 --block-k 64 --block-n 128'
# call 6 (deeper pipelines)
CELLS6='plain_s4|--plain --block-i 64 --block-k 64 --block-n 128 --stages 4
plain_s5|--plain --block-i 64 --block-k 64 --block-n 128 --stages 5
plain_s6|--plain --block-i 64 --block-k 64 --block-n 128 --stages 6
plain_s6_w8|--plain --block-i 64 --block-k 64 --block-n 128 --stages 6 --warps 8
plain_k32_s6|--plain --block-i 64 --block-k 32 --block-n 128 --stages 6
chain_s5|--block-i 64 --block-k 64 --block-n 128 --stages 5'
# call 7 (after --stack was added)
CELLS7='plain_stack|--plain --stack --block-n 128
plain_stack_gu|--plain --stack --block-n 128 --sink gate_up
plain_stack_n256|--plain --stack
plain_bi64_s4|--plain --block-i 64 --block-k 64 --block-n 128 --stages 4
chain_stack_k64|--stack --block-k 64 --block-n 128
plain_stack_b|--plain --stack --block-n 128'
case "${CELLS:-2}" in 3) LIST=$CELLS3 ;; 4) LIST=$CELLS4 ;; 5) LIST=$CELLS5 ;; 6) LIST=$CELLS6 ;; 7) LIST=$CELLS7 ;;
  *) LIST=$CELLS2 ;; esac
i=0
while IFS='|' read -r name args; do
  [ -n "$name" ] || continue
  i=$((i + 1))
  timeout -k 5 "${T_CELL:-60}" python3 benchmarks/fused_mlp.py $args --out "$OUT/$i-$name.json" > "$OUT/$i-$name.txt" 2>&1
  echo "$i $name ($args): exit=$? $(date -u +%T)" | tee -a "$OUT/log"
  grep -E ' us a layer|^error|Error' "$OUT/$i-$name.txt" | tail -n 4 | tee -a "$OUT/log"
done <<<"$LIST"
(cd "$OUT" && shopt -s nullglob && f=([0-9]*-*) && [ ${#f[@]} -gt 0 ] && tar czf cells.tgz "${f[@]}" && rm -f "${f[@]}")
