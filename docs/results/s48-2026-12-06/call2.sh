# call 2, the same warm H100: the roofline's window section (w = 128, 8K-1M: the Triton window stream against
# FlexAttention's sliding window, forward and fwd+bwd, each beside its floor), target 3 on an H100 at the current code.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
timeout -k 5 560 python3 benchmarks/roofline.py --sections window --deadline-s 520 --out $OUT/roofline \
  2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -v "^\[roofline\]"
