#!/usr/bin/env bash
# Issue #18, target 1: programmatic dependent launch with the GEMV's L2 weight prefetch
# (docs/performance.md, inference change 17), in one GPU call of < 600 s on one H200:
#   1. the GPU tests of the GEMV, the fused GEMV, the decode kernel and the engine with GEMVs, run
#      with ORTHROS_PDL=1 (correctness with the early launches, CUDA-graph replays included);
#   2. an A/B of the compiled decode step (fused GEMVs, B = 1, the pair and the Transformer) in
#      separate processes, one per setting, interleaved: off (ORTHROS_PDL=0), pdl (PDL, no
#      prefetch), pfN (PDL and an N MB prefetch budget a GEMV). Each process measures its own
#      copy rate; compare the step times (ms), which do not depend on it. A setting's name: off, or
#      pdl (no prefetch) / pfN (an N MB budget), then "end" (GEMVs signal after their K loop,
#      ORTHROS_PDL_SIGNAL=end) or "early" (the split-K reduce and the decode combine signal before
#      their wait, ORTHROS_PDL_SIGNAL=early), then "m2" (one-row GEMVs launch without PDL,
#      ORTHROS_PDL_MIN_M=2), then "combo" (the decode pieces compiled with Inductor's combo kernels:
#      --decode-compile-options '{"realize_reads_threshold": 5, "combo_kernels": true}'). The
#      engine's defaults: pf4m2.
# Nothing is installed: the image's torch / triton run it. From the repo root (the `run` tool):
#   command: ORTHROS_COMMIT=<sha> bash benchmarks/pdl_gpu.sh
# Optional: VARIANTS (default "off pf8 pdl pf16 off pf8"), CONTEXTS (1024,4096), T_TESTS (150 s),
# TESTS=0 (no tests), T_SIGNAL (the tests' ORTHROS_PDL_SIGNAL, start), T_CELL (75 s a process);
# PROFILE="<settings>" (profile_engine.py at 1K, one process a setting); ROOF=1 (then the
# roofline's decode section, 1K-128K, with the defaults and gpt-fast at 1K: carry .gpu/gpt-fast).
set -u
OUT=${OUT:-/tmp/pdl-gpu}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
VARIANTS=${VARIANTS:-"off pf8 pdl pf16 off pf8"} CONTEXTS=${CONTEXTS:-1024,4096}
T_TESTS=${T_TESTS:-150} T_CELL=${T_CELL:-75}
settings() {  # a setting's name -> its environment in env_, extra roofline arguments in args_ (return 1: not a setting's name)
  local rest=$1
  env_=(ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=1) args_=()
  case "$rest" in *combo) args_=(--decode-compile-options '{"realize_reads_threshold": 5, "combo_kernels": true}')
                          rest=${rest%combo} ;; esac
  case "$rest" in *m2) env_+=(ORTHROS_PDL_MIN_M=2); rest=${rest%m2} ;; esac
  case "$rest" in *end) env_+=(ORTHROS_PDL_SIGNAL=end); rest=${rest%end} ;;
                  *early) env_+=(ORTHROS_PDL_SIGNAL=early); rest=${rest%early} ;; esac
  case "$rest" in
    off) [ ${#env_[@]} -eq 2 ] || return 1; env_=(ORTHROS_PDL=0) ;;
    pdl) env_+=(ORTHROS_GEMV_PREFETCH_MB=0) ;;
    pf[0-9]*) [[ ${rest#pf} =~ ^[0-9]+$ ]] || return 1; env_+=(ORTHROS_GEMV_PREFETCH_MB="${rest#pf}") ;;
    *) return 1 ;;
  esac
}
for v in $VARIANTS ${PROFILE:-}; do  # every name checked before any work
  settings "$v" || { echo "VARIANTS: unknown setting '$v' (off, or pdl / pfN, then optionally end or early, then m2; then optionally combo)" >&2; exit 2; }
done
mkdir -p "$OUT"
{ date -u; echo "commit $ORTHROS_COMMIT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/log"
if [ "${TESTS:-1}" != 0 ]; then  # every GEMV with PDL here, the one-row ones too
  ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=1 ORTHROS_PDL_SIGNAL=${T_SIGNAL:-start} timeout -k 10 "$T_TESTS" python3 -m pytest tests/ops/test_gemv.py \
    tests/ops/test_gemv_fused.py tests/ops/test_decode.py tests/engine/test_engine_gemv.py -m gpu -n 8 \
    -p no:cacheprovider -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests (ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=1 ORTHROS_PDL_SIGNAL=${T_SIGNAL:-start}): exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
  grep -E '^(FAILED|ERROR)' "$OUT/gpu_tests.log" | head -n 20 | tee -a "$OUT/log"
fi
i=0
for v in $VARIANTS; do
  i=$((i + 1))
  settings "$v"
  D="$OUT/$i-$v"; mkdir -p "$D"
  env "${env_[@]}" timeout -k 10 "$T_CELL" python3 benchmarks/roofline.py --sections decode --gemv \
    --systems orthros+gemv,full+gemv --contexts "$CONTEXTS" "${args_[@]}" --out "$D" > "$D/log.txt" 2>&1
  echo "$i $v (${env_[*]} ${args_[*]}): exit=$? $(grep -E '^# issue 18' "$D/log.txt" | sed 's/.*copy/copy/')" | tee -a "$OUT/log"
  grep -E '^decode (orthros|full)\+gemv' "$D/log.txt" | tee -a "$OUT/log"
  rm -f "$D"/*.tmp "$D"/*.tmp.png
done
python3 - "$OUT" <<'EOF' 2>&1 | tee -a "$OUT/log"
import json, os, statistics, sys
out = sys.argv[1]
runs = {}
for d in sorted(os.listdir(out)):
    p = os.path.join(out, d, "results.json")
    if not os.path.exists(p):
        continue
    v = d.split("-", 1)[1]
    for r in json.load(open(p))["rows"]:
        if "ms_per_step" in r:
            runs.setdefault((r["system"], r["L"], v), []).append(r["ms_per_step"])
print("median ms a step by setting (processes):")
for (s, L, v), ms in sorted(runs.items()):
    base = runs.get((s, L, "off"))
    rel = f"  {statistics.median(ms) / statistics.median(base):.4f}x off" if base else ""
    print(f"  {s:13s} L={L:6d} {v:5s} {statistics.median(ms):.3f} ms ({', '.join(f'{m:.3f}' for m in ms)}){rel}")
EOF
if [ "${ROOF:-0}" = 1 ]; then  # the roofline's decode section with the defaults (PDL on for >= 2 rows), gpt-fast at 1K
  mkdir -p "$OUT/roofline"
  timeout -k 10 "${T_ROOF:-300}" python3 benchmarks/roofline.py --sections decode --gemv \
    --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir "${GPT_FAST:-.gpu/gpt-fast}" \
    --out "$OUT/roofline" > "$OUT/roofline/log.txt" 2>&1
  echo "roofline decode (defaults): exit=$?" | tee -a "$OUT/log"
  grep -v "it/s\|it \[" "$OUT/roofline/log.txt" | tail -n 30 | tee -a "$OUT/log"
  rm -f "$OUT/roofline"/*.tmp "$OUT/roofline"/*.tmp.png
fi
if [ -n "${PROFILE:-}" ]; then  # the 1K step kernel by kernel, one process a setting of PROFILE (e.g. "pf4m2 pf4earlym2combo")
  for v in $PROFILE; do
    settings "$v"
    env "${env_[@]}" timeout -k 10 "${T_PROFILE:-120}" python3 benchmarks/profile_engine.py --compile --gemv --context 1024 \
      "${args_[@]}" --json "$OUT/profile_$v.json" > "$OUT/profile_$v.log" 2>&1
    echo "profile $v (${env_[*]} ${args_[*]}): exit=$? $(grep -E '^== ' "$OUT/profile_$v.log" | tr '\n' ' ')" | tee -a "$OUT/log"
  done
fi
# one archive of the per-process folders and the roofline's (a call returns at most 8 files)
(cd "$OUT" && shopt -s nullglob && dirs=([0-9]*-* [r]oofline) && [ ${#dirs[@]} -gt 0 ] \
  && tar czf runs.tgz "${dirs[@]}" && rm -rf "${dirs[@]}")
ls -la "$OUT"
