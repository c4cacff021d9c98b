# call 3 (carry .gpu .whl): test_triton.py's `gpu` tests again after 7895ab2 (the gradient measure's empty-list
# failure, found on the CPU from the sweeps' own examples), cut by SIGINT at LIMIT so that pytest still prints its
# failure report (call 2's timeout killed it before the report); the card and versions printed.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -c "import torch, triton, hypothesis; print(torch.__version__, triton.__version__, hypothesis.__version__, torch.backends.cuda.matmul.allow_tf32)" | tee -a $OUT/card.log
timeout -s INT -k 30 ${LIMIT:-420} python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 12 -rfE --tb=short \
  -W ignore tests/ops/test_triton.py --junitxml=$OUT/junit.xml > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
grep -E " (PASSED|FAILED|ERROR|SKIPPED)" $OUT/gpu_tests.log | grep -oE "(PASSED|FAILED|ERROR|SKIPPED)" | sort | uniq -c
grep -E "^(E |FAILED|ERROR)" $OUT/gpu_tests.log | cut -c1-300 | head -60
tail -3 $OUT/gpu_tests.log
