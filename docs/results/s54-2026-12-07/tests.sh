# (copied from s53, which copied s52) the `gpu` tests of the folders given ($2), cut at $1 seconds by SIGINT so the report prints; a count by outcome, the slowest.
limit=$1; shift
timeout -s INT -k 30 $limit python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 12 -rfEs -W ignore $1 \
  --durations 12 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
python3 -m pytest -p no:cacheprovider -o addopts="" -q -W ignore tests/ops/test_gdn.py -k conv1d_fla \
  > $OUT/conv1d_fla.log 2>&1; echo "conv1d_fla exit=$?"; tail -1 $OUT/conv1d_fla.log
grep -E " (PASSED|FAILED|ERROR|SKIPPED)" $OUT/gpu_tests.log | grep -oE "(PASSED|FAILED|ERROR|SKIPPED)" | sort | uniq -c
grep -E "FAILED|ERROR" $OUT/gpu_tests.log | head -20
tail -30 $OUT/gpu_tests.log
