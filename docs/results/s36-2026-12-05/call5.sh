# call 5 (not run: the session's device time was spent; for the next session, carry .gpu/gpt-fast): gpt-fast's
# step traced again with the Inductor source and tuned launch config of its heaviest kernels, then our fused
# GEMV's sweep at the two sites the peer's kernels match or beat (gate/up, QKV) at 1 and 2 rows
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
timeout -k 5 280 python3 benchmarks/profile_engine.py --compile --gemv --timeline --context 1024 --peer .gpu/gpt-fast \
  --peer-sources "$OUT/peer_kernels" --json "$OUT/profile_peer.json" 2>&1 | tee "$OUT/profile_peer.log"
(cd "$OUT" && [ -d peer_kernels ] && tar czf peer_kernels.tgz peer_kernels && rm -rf peer_kernels)
timeout -k 5 280 python3 benchmarks/gemv.py --fused --sweep --m 1,2 --sites norm_gate_up,norm_qkv --deadline-s 240 \
  --out "$OUT/gemv_sweep.json" > "$OUT/gemv_sweep.log" 2>&1
tail -n 40 "$OUT/gemv_sweep.log"
