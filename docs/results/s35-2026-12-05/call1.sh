# call 1 (12:46 UTC, commit f1e7433, the `run` tool, carry .gpu): W_O's preload built once, then the 1K A/B
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
(date -u; python3 -c "from orthros.ops.gemv import preload; print(preload.build())") 2>&1 | tee $OUT/build.log
OUT=$OUT/ab TESTS=0 CONTEXTS=1024 T_CELL=60 ORTHROS_COMMIT=f1e7433 VARIANTS="pf4m2 pf4m2wp20late pf4m2wp20m pf4m2" \
  bash benchmarks/pdl_gpu.sh 2>&1 | tail -25 | tee $OUT/ab.log
