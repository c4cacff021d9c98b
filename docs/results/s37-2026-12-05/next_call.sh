# For the next session (not run; carry .gpu/gpt-fast): on an H200 if one is lent, else on whatever comes. Whether
# the Transformer's gate/up tile that won on the H100 inside the step (4x2048 defer w8 st3, 0.984 of the table's
# step) wins on the H200 too (CONFIGS was measured there; adopt it only if it does), with the pair's gate/up and QKV
# candidates again; then the peer traced on this card with its tuned configs (~420 s in all)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
nvidia-smi --query-gpu=name --format=csv,noheader
C="table;4x2048 s1 defer w8 st3;8x512 s1 defer w4 st4;4x1024 s1 defer w8 st2;16x256 s1 defer w4 st4"
timeout -k 5 200 python3 benchmarks/gemv_engine.py --site gate_up --configs "$C" --rounds 3 --out "$OUT/gate_up.json" \
  > "$OUT/gate_up.log" 2>&1
echo "gate_up: exit=$?"; sed -n '/inside the decode step/,$p' "$OUT/gate_up.log"
timeout -k 5 120 python3 benchmarks/gemv_engine.py --site qkv --modes orthros --rounds 3 --out "$OUT/qkv.json" \
  --configs "table;8x512 s1 defer w4 st4;64x256 s1 dot w4 st4;16x256 s1 defer w4 st4" > "$OUT/qkv.log" 2>&1
echo "qkv: exit=$?"; sed -n '/inside the decode step/,$p' "$OUT/qkv.log"
timeout -k 5 180 python3 benchmarks/profile_engine.py --compile --gemv --timeline --context 1024 --peer .gpu/gpt-fast \
  --json "$OUT/profile_peer.json" > "$OUT/profile_peer.log" 2>&1
echo "profile: exit=$?"; grep -E "^== " "$OUT/profile_peer.log"
