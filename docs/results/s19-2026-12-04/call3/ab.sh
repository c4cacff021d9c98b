set -u
export PYTHONUNBUFFERED=1
python3 -m pytest tests/ops/test_gemv_fused.py tests/engine/test_engine_gemv.py -m gpu -n 4 -p no:cacheprovider -q -W ignore 2>&1 | tail -3 | tee $OUT/tests.log
i=0
for w in base 8 16 4 base 8 16; do
  i=$((i+1))
  if [ $w = base ]; then v=pf4m2nohoist; W=8; else v=pf4m2; W=$w; fi
  ORTHROS_GEMV_NORM_OUT_WARPS=$W OUT=$OUT/r$i-w$w VARIANTS="$v" CONTEXTS=1024 TESTS=0 T_CELL=70 bash benchmarks/pdl_gpu.sh > $OUT/r$i.log 2>&1
  echo "$i $w: $(grep -hE "^decode (orthros|full)" $OUT/r$i-w$w/log | tr "\n" " ")" | tee -a $OUT/summary
done
