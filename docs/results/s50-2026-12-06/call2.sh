# call 2 (carry .gpu .whl): whichever card comes, on the committed tree (no helper works during it). On an H200: the
# fortieth session's roofline at 1K (call1.sh's). On anything else: the `gpu`-marked tests at this session's code (the
# decode step's reference under autograd and the QKV step's parameter checks, the GEMV's one-dtype rule, the GDN ops'
# device / cu_seqlens checks, orthros_attention's kv_start / cu_seqlens / backend warnings, the engine's max_seq_len
# limit, lazy package and token checks, the benchmarks' cache sizes at the position limit), less the window candidates
# and the seven fp32 Triton backward cases (no kernel changed), as the forty-eighth session's call 3.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
case "$name" in
  *H200*)
    timeout -k 5 540 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *)
    timeout -k 5 545 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 6 -rfEs -W ignore tests \
      -k "not rel_masks_gpu and not forward_variants_gpu and not dq_gqa_variant_gpu and not (test_dq_from_ds_gpu and dtype1) and not (test_hypothesis_gpu and dtype2)" \
      --durations 15 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
    grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | sed 's/.*\] //' | awk '{print $1}' | sort | uniq -c
    tail -25 $OUT/gpu_tests.log ;;
esac
