# call 2 (14:10 UTC, the same warm machine): call 1's GPU tests again, with room to finish (call 1's 140 s
# limit stopped them as their last tests ended, before pytest's summary)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=1 timeout -k 10 380 python3 -m pytest tests/ops/test_gemv.py tests/ops/test_gemv_fused.py \
  tests/ops/test_decode.py tests/engine/test_engine_gemv.py tests/engine/test_decode_compile_options.py \
  tests/engine/test_decode_qkv_kernel.py -m gpu -n 6 -p no:cacheprovider -rfE -W ignore 2>&1 | tee "$OUT/gpu_tests2.log"
