# call 1 (carry .gpu/gpt-fast): where gpt-fast's spread between processes comes from. Three processes of the
# peer alone at 1K (profile_engine.py --modes ''), each timing its step three times (caches set up anew each
# time) and tracing it kernel by kernel: processes 1 and 2 each with a fresh Inductor cache (coordinate descent
# tunes anew), process 3 on process 2's cache (the same kernels and configs). The GPU's clocks, power and
# temperature are logged every 200 ms throughout (~480 s in all)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
W=/tmp/s38; mkdir -p $W
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 200 > $W/smi.csv 2>&1 &
SMI=$!
for r in 1 2 3; do
  case $r in 1) d=/tmp/ind-a t=210;; 2) d=/tmp/ind-b t=210;; 3) d=/tmp/ind-b t=130;; esac
  echo "process $r start $(date -u +%T) cache $d"
  TORCHINDUCTOR_CACHE_DIR=$d timeout -k 5 $t python3 benchmarks/profile_engine.py --compile --gemv --timeline \
    --context 1024 --modes "" --peer .gpu/gpt-fast --peer-repeats 3 --peer-sources $W/src-$r \
    --json $W/peer-$r.json > $W/peer-$r.log 2>&1
  echo "process $r: exit=$? end $(date -u +%T)"; grep -E "^== gpt-fast|timed 3 times|graph timeline" $W/peer-$r.log
done
kill $SMI
tail -n +2 $W/smi.csv | awk -F', ' '{print $2}' | sort | uniq -c | sort -rn | head -5
cp $W/peer-*.log $OUT/ ; tar czf $OUT/s38_call1.tgz -C $W .
