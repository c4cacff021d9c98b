# For the next session (not run; carry .gpu/gpt-fast): on an H200 if one is lent, else on whatever comes. The
# roofline's decode section at 1K with gpt-fast in four setups of the process (its row the fastest), the pair and
# the Transformer beside it (~420 s on an H200: the peer's first compile tunes for ~110 s). Then, in a second call,
# ../s37-2026-12-05/next_call.sh (the H100's Transformer gate/up tile timed on the H200)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 540 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
  --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
  2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "decode |setups|decode_vs"
