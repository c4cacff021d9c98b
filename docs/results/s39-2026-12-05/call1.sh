# call 1 (carry .gpu/gpt-fast): whichever card comes. On an H200, the thirty-eighth session's next call (the roofline's
# decode section at 1K, the peer in four setups of the process, the pair and the Transformer beside it). On an H100,
# the GEMV sweep at every decode shape (benchmarks/gemv.py --sweep): how far a read-only weight stream runs past the
# copy bandwidth on this card, so that target 1's need (the pair at 5.205 ms) can be read against a read floor
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name"
case "$name" in
  *H200*) bash docs/results/s38-2026-12-05/next_call.sh ;;
  *) timeout -k 5 420 python3 benchmarks/gemv.py --sweep --deadline-s 300 --out $OUT/gemv.json 2>&1 \
       | grep -v -E "Warning|warn_once" | tee $OUT/gemv.log | tail -45 ;;
esac
