# call 3 (carry .gpu .whl): after the 1M-token cases moved into one `gpu_alone` test (run with no other test beside
# it): the 11 test_triton.py `gpu` tests that call 1 failed (all out of memory), with 11 workers, then
# `pytest -m gpu_alone` alone (the 1M-token case of each of the four forward variants).
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
F=tests/ops/test_triton.py
timeout -s INT -k 20 ${LIMIT:-360} python3 -m pytest -p no:cacheprovider -o addopts="" -v -n 11 -rfEs --tb=short -W ignore \
  "$F::test_forward_variants_gpu[dtype0-edge]" "$F::test_forward_variants_gpu[dtype1-gqa]" \
  "$F::test_forward_variants_gpu[dtype1-gqa_masked]" "$F::test_forward_variants_gpu[dtype1-base]" \
  "$F::test_dq_gqa_variant_gpu[dtype0-edge-True]" "$F::test_dq_gqa_variant_gpu[dtype0-gqa-False]" \
  "$F::test_dq_gqa_variant_gpu[dtype0-gqa-True]" "$F::test_dq_gqa_variant_gpu[dtype1-edge+dkdv-False]" \
  "$F::test_rel_masks_gpu[dtype1-gqa]" "$F::test_dq_gqa_variant_gpu[dtype1-gqa-True]" \
  "$F::test_dq_gqa_variant_gpu[dtype1-gqa-False]" --durations 11 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
grep -E " (PASSED|FAILED|ERROR|SKIPPED)" $OUT/gpu_tests.log | grep -oE "(PASSED|FAILED|ERROR|SKIPPED)" | sort | uniq -c
grep -E "^(E |FAILED|ERROR)" $OUT/gpu_tests.log | cut -c1-300 | head -30; tail -14 $OUT/gpu_tests.log
timeout -s INT -k 10 ${LIMIT_ALONE:-170} python3 -m pytest -p no:cacheprovider -o addopts="" -v -rfEs --tb=short -W ignore \
  -m gpu_alone $F > $OUT/alone.log 2>&1; echo "gpu_alone exit=$?"; tail -8 $OUT/alone.log
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
