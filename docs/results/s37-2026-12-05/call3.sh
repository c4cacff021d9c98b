# call 3 (carry nothing): the other three sites' candidates inside the engine's step, as call 2 did gate/up: QKV and
# down for both modes; the o-projection per mode (the pair's table row splits K, and its reduce computes the next
# norm, which the compiled step fixes when traced, so its candidates split K too; the Transformer's does not)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
run() { local name=$1; shift; timeout -k 5 170 python3 benchmarks/gemv_engine.py "$@" --rounds 3 --out "$OUT/$name.json" \
  > "$OUT/$name.log" 2>&1; echo "$name: exit=$?"; sed -n '/inside the decode step/,$p' "$OUT/$name.log"; }
run qkv --site qkv --configs "table;32x256 dot w4 st3;64x128 dot w4 st3;64x256 dot w8 st3;64x256 dot w4 st4;128x128 dot w4 st3;16x256 defer w4 st4;8x512 defer w4 st4;4x2048 defer w8 st3"
run down --site down --configs "table;16x256 defer w4 st4;4x2048 defer w8 st3;8x1024 defer w8 st3;16x512 defer w8 st3;4x1024 defer w4 st3;64x128 dot w4 st3;32x256 dot w4 st3"
run o_pair --site o --modes orthros --configs "table;64x128 s2 dot w4 st3;32x128 s4 dot w4 st3;64x256 s4 dot w4 st3;64x64 s4 dot w4 st3;64x128 s8 dot w4 st3;16x256 s4 defer w4 st4;8x512 s2 defer w4 st4"
run o_full --site o --modes full --configs "table;16x256 defer w4 st4;4x2048 defer w8 st3;8x1024 defer w8 st3;4x1024 defer w4 st3;16x512 defer w8 st3"
