# call 2 (carry .gpu/gpt-fast), on call 1's warm machine when it was not an H200: the batched section at 32K
# (B = 8 fits in 80 GB; B = 32 and 64 need 144 and 289 GiB of KV cache and are recorded as skipped).
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
(git status --short 2>/dev/null | grep -v '^??' | head -20) | tee -a $OUT/card.log
export PYTHONPATH=$PWD
OUT=$OUT/batched SECTIONS=batched T_SWEEP=560 DEADLINE=500 EXTRA="--batched-contexts 32768" \
  bash benchmarks/roofline_gpu.sh 2>&1 | grep -v -E "Warning|warn_once|it/s|s/it" | tail -60
