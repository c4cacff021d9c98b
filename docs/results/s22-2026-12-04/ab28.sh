# Twenty-second session, inference change 28: GPU tests of the L2 warm-up, then an interleaved A/B at
# 1K of ORTHROS_DECODE_WARM_MB (VARIANTS: wN = N MB), the pair and the Transformer, one process a
# setting; then the timeline of PROFILE's settings. From the repo root: ORTHROS_COMMIT=<sha> bash .gpu/ab28.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ab28}; mkdir -p "$OUT"
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 | tee "$OUT/log"
if [ "${TESTS:-1}" != 0 ]; then
  PYTHONPATH=$PWD timeout -k 10 "${T_TESTS:-150}" python3 -m pytest tests/ops/test_gemv.py tests/engine/test_engine_gemv.py \
    -k "warm" -n 4 -p no:cacheprovider -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
  grep -E '^(FAILED|ERROR)' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
fi
i=0
for v in ${VARIANTS-w0 w12 w16 w0 w12 w16}; do
  i=$((i+1)); D=$OUT/$i-$v; mkdir -p "$D"
  mb=${v#w}; mb=${mb%p*}; pr=128; [[ $v == *p* ]] && pr=${v#*p}
  PYTHONPATH=$PWD ORTHROS_DECODE_WARM_MB=$mb ORTHROS_DECODE_WARM_PROGRAMS=$pr timeout -k 5 "${T_CELL:-75}" python3 benchmarks/roofline.py --sections decode --gemv \
    --systems "${SYSTEMS:-orthros+gemv,full+gemv}" --contexts "${CTX:-1024}" --out "$D" > "$D/log.txt" 2>&1
  echo "$i $v: exit=$? $(grep -E '^# issue 18' "$D/log.txt" | sed 's/.*copy/copy/')" | tee -a "$OUT/log"
  grep -E '^decode (orthros|full)\+gemv B=1 L=[0-9]+: ' "$D/log.txt" | cut -c1-100 | tee -a "$OUT/log"
  rm -f "$D"/*.tmp*
done
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$OUT/log"
import json, os, statistics, sys
out = sys.argv[1]; runs = {}
for d in sorted(os.listdir(out)):
    p = os.path.join(out, d, "results.json")
    if os.path.exists(p):
        for r in json.load(open(p))["rows"]:
            if "ms_per_step" in r:
                runs.setdefault((r["system"], r.get("L"), d.split("-", 1)[1]), []).append(r["ms_per_step"])
for (s, c, v), ms in sorted(runs.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2])):
    base = runs.get((s, c, "w0"))
    rel = f"  {statistics.median(ms) - statistics.median(base):+.3f} ms vs w0" if base else ""
    print(f"  {s:13s} {c} {v:4s} {statistics.median(ms):.3f} ms ({', '.join(f'{m:.3f}' for m in ms)}){rel}")
PY
for v in ${PROFILE-w16}; do
  mb=${v#w}; mb=${mb%p*}; pr=128; [[ $v == *p* ]] && pr=${v#*p}
  PYTHONPATH=$PWD ORTHROS_DECODE_WARM_MB=$mb ORTHROS_DECODE_WARM_PROGRAMS=$pr timeout -k 10 120 python3 benchmarks/profile_engine.py --compile --gemv --timeline \
    --context 1024 --json "$OUT/profile_$v.json" > "$OUT/profile_$v.log" 2>&1
  echo "profile $v: exit=$?" | tee -a "$OUT/log"; grep -E '^== |graph timeline' "$OUT/profile_$v.log" | tee -a "$OUT/log"
done
(cd "$OUT" && shopt -s nullglob && d=([0-9]*-*) && [ ${#d[@]} -gt 0 ] && tar czf runs.tgz "${d[@]}" && rm -rf "${d[@]}")
ls "$OUT"
