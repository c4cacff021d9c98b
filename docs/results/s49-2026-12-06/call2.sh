# call 2 (carry .whl): whichever card comes. The `gpu`-marked tests of the files this session's fixes touched
# (ops: backends' name check, kv_start range, merge / decode argument checks, the GDN step's checks and causal_conv1d's
# window copy; the GDN layer's decode step; the models' cache check; the engine's cut-short conversations), with
# fla-core 0.6.0 from the carried wheel.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/site:$PWD
timeout -k 5 360 python3 -m pytest -p no:cacheprovider -o addopts="" -v -m gpu -n 6 -rfEs -W ignore \
  tests/ops/test_decode.py tests/ops/test_reference.py tests/ops/test_merge.py tests/ops/test_gdn.py tests/layers \
  tests/models tests/engine --durations 10 > $OUT/gpu_tests.log 2>&1; echo "pytest exit=$?"
grep -E "PASSED|FAILED|ERROR|SKIPPED" $OUT/gpu_tests.log | sed 's/.*\] //' | awk '{print $1}' | sort | uniq -c
tail -25 $OUT/gpu_tests.log
