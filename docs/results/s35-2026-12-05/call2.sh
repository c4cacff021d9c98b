# calls 2 and 3 (12:49 and 12:51 UTC, commit f1e7433): the 1K step's timeline, kernel by kernel, one process a
# setting; call 2 ran PROFILE="pf4m2wp20late pf4m2" T_PROFILE=125, call 3 PROFILE="pf4m2wp20m" T_PROFILE=100
OUT=$OUT TESTS=0 VARIANTS="" ORTHROS_COMMIT=f1e7433 PROFILE="${PROFILE:-pf4m2 pf4m2wp20late pf4m2wp20m}" \
  exec bash benchmarks/pdl_gpu.sh
