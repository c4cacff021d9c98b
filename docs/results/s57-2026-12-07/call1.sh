# call 1 (carry .gpu .whl), whichever card comes. On an H200: the 1K decode roofline of issue #18 (one more process of
# this decode code). On any card: the `gpu` tests of tests/engine, tests/models and tests/benchmarks/test_inference.py,
# which run this session's changed command paths (generate's, bench's and the checkpoint checks' new order,
# utils.check_device's early refusal, checkpoint_files in the remote code) on CUDA.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -c "import torch, triton, hypothesis; print(torch.__version__, triton.__version__, hypothesis.__version__)" | tee -a $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
cut_gpu=300 cut_cli=200  # within the call's 600 s: less where the roofline ran first
case "$name" in
  *H200*) cut_gpu=180 cut_cli=100
    timeout -k 5 280 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
      --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
      2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 " ;;
esac
bash docs/results/s54-2026-12-07/tests.sh $cut_gpu "tests/engine tests/models tests/benchmarks/test_inference.py"
# the commands' refusals (CPU tests, not marked gpu) on a machine that has CUDA: the early checks must not refuse
# what CUDA makes valid, nor the late ones miss what it makes invalid
timeout -k 5 $cut_cli python3 -m pytest -p no:cacheprovider -o addopts="" -q -n 8 -rfEs -W ignore tests/test_orthros_cli.py \
  tests/engine/test_cli_errors.py tests/test_info.py > $OUT/cli_tests.log 2>&1; echo "cli tests exit=$?"; tail -15 $OUT/cli_tests.log
nvidia-smi --query-gpu=memory.used,memory.total --format=csv
