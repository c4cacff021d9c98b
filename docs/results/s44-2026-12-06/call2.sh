# call 2 (carry .gpu/gpt-fast .whl): the sampling check after the race's clamp (the forty-third session's
# call2_sample.py, unchanged), then the 103 `gpu` tests again, verbose, so that the three left running at call 1's
# limit are named.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
timeout -k 5 90 python3 docs/results/s43-2026-12-06/call2_sample.py 2>&1 | tee $OUT/sample.log | tail -6
timeout -k 5 470 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 6 -rfE -W ignore tests \
  -k "not rel_masks_gpu and not forward_variants_gpu and not dq_gqa_variant_gpu" --durations 15 \
  > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | sed 's/.*\] //' | awk '{print $1}' | sort | uniq -c
tail -25 $OUT/gpu_tests.log
