# call 1 (carry .gpu/gpt-fast .whl): whichever card comes.
# Any card: the forty-third session's corrected sampling check (call2_sample.py, ~40 s).
# On an H200: the fortieth session's roofline at 1K (the pair, the Transformer and the peer in four setups; ~420 s).
# On anything else: every `gpu`-marked test outside the window candidates (those need more than one call and ran in
#   the forty-first session), six workers, so the whole CUDA side is checked at this commit.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
timeout -k 5 90 python3 docs/results/s43-2026-12-06/call2_sample.py 2>&1 | tee $OUT/sample.log | tail -6
case "$name" in
  *H200*)
    timeout -k 5 470 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
  *)
    timeout -k 5 480 python3 -m pytest -p no:cacheprovider -o addopts="" -q -m gpu -n 6 -rfE -W ignore tests \
      -k "not rel_masks_gpu and not forward_variants_gpu and not dq_gqa_variant_gpu" --durations 15 \
      2>&1 | tee $OUT/gpu_tests.log | tail -45 ;;
esac
