# call 4: the pair's, the Transformer's and gpt-fast's 1K steps traced kernel by kernel in one process (carry .gpu/gpt-fast)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
timeout -k 5 ${T_PROFILE:-290} python3 benchmarks/profile_engine.py --compile --gemv --timeline --context 1024 \
  --peer .gpu/gpt-fast --json "$OUT/profile_peer.json" 2>&1 | tee "$OUT/profile_peer.log"
