# call 5 (carry .gpu/gpt-fast): the roofline at 1K with the read ceiling as kept, the peer in four setups, the pair and
# the Transformer beside it; the "what 1.2x needs" table (~240 s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 60 python3 -m pytest -p no:cacheprovider -o addopts="" -q -m gpu tests/benchmarks/test_read_stream.py \
  2>&1 | tail -3 | tee $OUT/gpu_tests.log
timeout -k 5 330 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
  --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
  2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 "
python3 -c "import json; m=json.load(open('$OUT/roofline/results.json'))['meta']; print(m['read_bw_how'], m['read_bw_candidates'])"
