# Twenty-first session, inference change 27: GPU tests, then an interleaved A/B at 1K of the tree of
# 4d1a43f (.gpu/base, "base") against the working tree ("new"), the working tree with
# ORTHROS_HEAD_GEMV=1 ("hg", call 1) or =0 ("nohg"), or with one-row GEMVs launched with PDL
# ("m1", ORTHROS_PDL_MIN_M=1), the pair and the Transformer (SYSTEMS), one process a setting; then
# the timeline of PROFILE's settings. From the repo root: ORTHROS_COMMIT=<sha> bash .gpu/ab27.sh
set -u
export PYTHONUNBUFFERED=1 ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=2 ORTHROS_GEMV_PREFETCH_MB=4
OUT=${OUT:-/tmp/ab27}; mkdir -p "$OUT"
{ date -u; echo "commit ${ORTHROS_COMMIT:-?}"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } 2>&1 | tee "$OUT/log"
if [ "${TESTS:-1}" != 0 ]; then
  PYTHONPATH=$PWD timeout -k 10 "${T_TESTS:-150}" python3 -m pytest tests/engine/test_engine_gemv.py tests/engine/test_decode_qkv_kernel.py \
    tests/engine/test_decode_compile_options.py -m gpu -n 6 -p no:cacheprovider -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests: exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
  grep -E '^(FAILED|ERROR)' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
fi
i=0
for v in ${VARIANTS-base new hg base new hg}; do
  i=$((i+1)); D=$OUT/$i-$v; mkdir -p "$D"
  tree=$PWD; [ "$v" = base ] && tree=$PWD/.gpu/base
  hg=1 mm=2; [ "$v" = nohg ] && hg=0; [ "$v" = m1 ] && mm=1; [ "${CALL1:-0}" = 1 ] && { hg=0; [ "$v" = hg ] && hg=1; }
  sys=${SYSTEMS:-orthros+gemv,full+gemv}; [ "$v" = m1 ] && sys=orthros+gemv
  PYTHONPATH=$tree ORTHROS_HEAD_GEMV=$hg ORTHROS_PDL_MIN_M=$mm timeout -k 5 "${T_CELL:-75}" python3 "$tree/benchmarks/roofline.py" --sections decode --gemv \
    --systems "$sys" --contexts 1024 --out "$D" > "$D/log.txt" 2>&1
  echo "$i $v: exit=$? $(grep -E '^# issue 18' "$D/log.txt" | sed 's/.*copy/copy/')" | tee -a "$OUT/log"
  grep -E '^decode (orthros|full)\+gemv B=1 L=1024: ' "$D/log.txt" | cut -c1-100 | tee -a "$OUT/log"
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
                runs.setdefault((r["system"], d.split("-", 1)[1]), []).append(r["ms_per_step"])
for (s, v), ms in sorted(runs.items()):
    base = runs.get((s, "base"))
    rel = f"  {statistics.median(ms) - statistics.median(base):+.3f} ms vs base" if base else ""
    print(f"  {s:13s} {v:5s} {statistics.median(ms):.3f} ms ({', '.join(f'{m:.3f}' for m in ms)}){rel}")
PY
for v in ${PROFILE-new}; do
  hg=1; [ "$v" = nohg ] && hg=0
  PYTHONPATH=$PWD ORTHROS_HEAD_GEMV=$hg timeout -k 10 120 python3 benchmarks/profile_engine.py --compile --gemv --timeline --context 1024 \
    --json "$OUT/profile_$v.json" > "$OUT/profile_$v.log" 2>&1
  echo "profile $v: exit=$?" | tee -a "$OUT/log"; grep -E '^== |graph timeline' "$OUT/profile_$v.log" | tee -a "$OUT/log"
done
(cd "$OUT" && shopt -s nullglob && d=([0-9]*-*) && [ ${#d[@]} -gt 0 ] && tar czf runs.tgz "${d[@]}" && rm -rf "${d[@]}")
ls "$OUT"
