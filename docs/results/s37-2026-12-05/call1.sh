# call 1 of the thirty-seventh session = the thirty-sixth's call5.sh, run unchanged at 9a49b11 (carry .gpu/gpt-fast): gpt-fast's
# step traced again with the Inductor source and tuned launch config of its heaviest kernels; our fused GEMV's
# sweep at the two sites the peer's kernels match or beat (gate/up, QKV) at 1 and 2 rows, its tile family in;
# then the engine's 1K step with the sweep's winners against the table's, one process each, interleaved (~570 s in all)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
timeout -k 5 180 python3 benchmarks/profile_engine.py --compile --gemv --timeline --context 1024 --peer .gpu/gpt-fast \
  --peer-sources "$OUT/peer_kernels" --json "$OUT/profile_peer.json" > "$OUT/profile_peer.log" 2>&1
echo "profile: exit=$?"; grep -E "^== |heaviest kernels" "$OUT/profile_peer.log"
(cd "$OUT" && [ -d peer_kernels ] && tar czf peer_kernels.tgz peer_kernels && rm -rf peer_kernels)
timeout -k 5 170 python3 benchmarks/gemv.py --fused --sweep --m 1,2 --sites norm_gate_up,norm_qkv --deadline-s 130 \
  --out "$OUT/gemv_sweep.json" > "$OUT/gemv_sweep.log" 2>&1
echo "sweep: exit=$?"; grep -E "fused-best|tuned|CONFIGS" "$OUT/gemv_sweep.log" | tail -n 12
i=0
for r in table swept table swept; do
  i=$((i + 1)); extra=(); [ "$r" = swept ] && extra=(--gemv-configs "$OUT/gemv_sweep.json")
  timeout -k 5 55 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 --systems orthros+gemv,full+gemv \
    "${extra[@]}" --out "$OUT/ab$i-$r" > "$OUT/ab$i-$r.log" 2>&1
  echo "$i $r: exit=$? $(grep -E '^ decode ' "$OUT/ab$i-$r.log" | tr -s ' ' | tr '\n' ';')"
done
