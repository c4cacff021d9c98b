# call 3 (carry .gpu .whl): why call 2's 22 test_triton.py failures failed (its log was cut at the limit before
# pytest's failure report): three of them, each failing within ~60 s there, with their tracebacks and hypothesis's
# falsifying examples; the card and versions printed.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm,ecc.errors.uncorrected.volatile.total --format=csv | tee -a $OUT/card.log
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())" | tee -a $OUT/card.log
timeout -k 5 ${LIMIT:-300} python3 -m pytest -p no:cacheprovider -o addopts="" -q -n 3 -rfE --tb=short -W ignore \
  "tests/ops/test_triton.py::test_hypothesis_gpu[dtype0-sft]" "tests/ops/test_triton.py::test_hypothesis_gpu[dtype1-sft]" \
  "tests/ops/test_triton.py::test_rel_masks_gpu[dtype0-gqa]" > $OUT/failures.log 2>&1; echo "pytest exit=$?"
grep -E "^E |Falsifying|run_case\(|^[a-z_]+=|AssertionError|Error" $OUT/failures.log | head -60
tail -5 $OUT/failures.log
