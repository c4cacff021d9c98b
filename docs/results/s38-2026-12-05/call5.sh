# call 5 (the ~240 s of device time left): gate/up's table config against the same with its weight loads
# evict_first, inside the pair's step (gemv_engine.py, one process, three rounds)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 170 python3 benchmarks/gemv_engine.py --site gate_up --modes orthros --configs "table;table ef" \
  --rounds 3 --out $OUT/gate_up_ef.json 2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/gate_up_ef.log | tail -8
