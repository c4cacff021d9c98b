# call 2 (carry nothing), on an H200 only: the pair's four GEMV sites' launch configs judged inside the engine's
# compiled, CUDA-graphed 1K step (benchmarks/gemv_engine.py, as the thirty-seventh session did on an H100). The
# CONFIGS table's M = 2 rows were chosen on an H200 from GEMVs timed alone (2026-12-02); inside the step they were
# judged only on an H100. "table ef" is the table's row with its weight loads evict_first (never timed on an H200).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT"
case "$name" in *H200*) ;; *) echo "not an H200: the sweep judges the H200's table; nothing run"; exit 0 ;; esac
# SITES: the sites to run (default all four; the session's device time left for two: SITES="gate_up down")
SITES=${SITES:-"gate_up qkv down o"} CUT=${CUT:-135}
run() { local site=$1; shift; case " $SITES " in *" $site "*) ;; *) return ;; esac
  timeout -k 5 $CUT python3 benchmarks/gemv_engine.py --site $site --modes orthros \
  --configs "$1" --rounds 3 --out "$OUT/$site.json" > "$OUT/$site.log" 2>&1
  echo "$site: exit=$?"; sed -n '/inside the decode step/,$p' "$OUT/$site.log"; }
run gate_up "table;table ef;8x512 defer w4 st4;4x2048 defer w8 st3;64x256 dot w4 st3;4x1024 defer w8 st2;16x256 defer w4 st4"
run qkv "table;table ef;8x512 defer w4 st4;64x256 dot w4 st4;64x128 dot w4 st3;16x256 defer w4 st4"
run down "table;table ef;8x1024 defer w8 st3;16x512 defer w8 st3;4x1024 defer w4 st3;4x2048 defer w8 st3"
run o "table;table ef;64x128 s2 dot w4 st3;64x64 s4 dot w4 st3;64x256 s4 dot w4 st3;8x512 s2 defer w4 st4"
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
