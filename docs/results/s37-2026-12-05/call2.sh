# call 2 (carry nothing): the gate/up GEMV's candidates judged inside the engine's compiled, CUDA-graphed step
# (benchmarks/gemv_engine.py), Orthros pair (M = 2, PDL on) and Transformer (M = 1, no PDL), the table's config
# timed in every round; then the pair again with ORTHROS_PDL_SIGNAL=end (each GEMV lets the kernel behind become
# resident only after its K loop), to test whether the early signal is what sinks multi-wave tiles at M = 2
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
C="table;8x512 s1 defer w4 st4;4x2048 s1 defer w8 st3;2x1024 s1 defer w16 st1;1x1024 s1 defer w16 st1"
C="$C;2x1024 s1 defer w8 st1;2x2048 s1 defer w8 st2;4x1024 s1 defer w8 st2;16x256 s1 defer w4 st4;2x4096 s1 defer w16 st1"
timeout -k 5 280 python3 benchmarks/gemv_engine.py --site gate_up --configs "$C" --rounds 3 --out "$OUT/gate_up.json" \
  > "$OUT/gate_up.log" 2>&1
echo "signal start: exit=$?"; sed -n '/inside the decode step/,$p' "$OUT/gate_up.log"
ORTHROS_PDL_SIGNAL=end timeout -k 5 200 python3 benchmarks/gemv_engine.py --site gate_up --configs "$C" --rounds 3 \
  --modes orthros --out "$OUT/gate_up_signal_end.json" > "$OUT/gate_up_signal_end.log" 2>&1
echo "signal end: exit=$?"; sed -n '/inside the decode step/,$p' "$OUT/gate_up_signal_end.log"
