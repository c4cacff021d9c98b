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
#      ORTHROS_PDL_SIGNAL=end), then "m2" (one-row GEMVs launch without PDL, ORTHROS_PDL_MIN_M=2),
#      then optionally "nocombo" (the decode pieces compiled without Inductor's combo kernels, as
#      before inference change 19), then optionally "noqkv" (the decode's q/k prologue and K/V write
#      outside the attention kernel, Engine(qkv_kernel=False), as before inference change 21) or
#      "nopeel" (that kernel's first key block not loaded ahead of its PDL wait, ORTHROS_QKV_PEEL=0),
#      then optionally "nohoist" (the post-attention norm in gate/up's prologue, not written by
#      W_O's split-K reduce, ORTHROS_GEMV_NORM_OUT=0, as before inference change 25).
#      The engine's defaults: pf4m2.
# Nothing is installed: the image's torch / triton run it. From the repo root (the `run` tool):
#   command: ORTHROS_COMMIT=<sha> bash benchmarks/pdl_gpu.sh
# Optional: VARIANTS (unset: "off pf8 pdl pf16 off pf8"; empty: none), CONTEXTS (1024,4096), T_TESTS (150 s),
# TESTS=0 (no tests), T_CELL (75 s a process); PROFILE="<settings>" (profile_engine.py --timeline at 1K,
# one process a setting); ROOF=N (then the roofline's decode section, 1K-128K, with the defaults and
# gpt-fast at 1K: carry .gpu/gpt-fast; then N - 1 more processes of the pair and gpt-fast at 1K).
set -u
OUT=${OUT:-/tmp/pdl-gpu}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
VARIANTS=${VARIANTS-"off pf8 pdl pf16 off pf8"} CONTEXTS=${CONTEXTS:-1024,4096}
T_TESTS=${T_TESTS:-150} T_CELL=${T_CELL:-75}
settings() {  # a setting's name -> its environment in env_, extra benchmark arguments in args_ (return 1: not a setting's name)
  local rest=$1 min_m=1
  args_=()
  local qkv_env=() hoist_env=()
  case "$rest" in *nohoist) hoist_env=(ORTHROS_GEMV_NORM_OUT=0); rest=${rest%nohoist} ;; esac
  case "$rest" in *noqkv) args_+=(--qkv-kernel off); rest=${rest%noqkv} ;;
    *nopeel) qkv_env=(ORTHROS_QKV_PEEL=0); rest=${rest%nopeel} ;; esac
  case "$rest" in *nocombo) args_+=(--decode-compile-options '{"realize_reads_threshold": 5}'); rest=${rest%nocombo} ;; esac
  case "$rest" in *m2) min_m=2; rest=${rest%m2} ;; esac
  env_=(ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=$min_m)
  case "$rest" in *end) env_+=(ORTHROS_PDL_SIGNAL=end); rest=${rest%end} ;; esac
  case "$rest" in
    off) env_=(ORTHROS_PDL=0) ;;
    pdl) env_+=(ORTHROS_GEMV_PREFETCH_MB=0) ;;
    pf[0-9]*) [[ ${rest#pf} =~ ^[0-9]+$ ]] || return 1; env_+=(ORTHROS_GEMV_PREFETCH_MB="${rest#pf}") ;;
    *) return 1 ;;
  esac
  env_+=("${qkv_env[@]}" "${hoist_env[@]}")
}
[[ ${ROOF:-0} =~ ^[0-9]+$ ]] || { echo "ROOF: give a count of roofline processes, got '$ROOF'" >&2; exit 2; }
for v in $VARIANTS ${PROFILE:-}; do  # every name checked before any work
  settings "$v" || { echo "VARIANTS / PROFILE: unknown setting '$v' (off, or pdl / pfN, then optionally end, then m2; then optionally nocombo, then optionally noqkv / nopeel, then optionally nohoist)" >&2; exit 2; }
done
mkdir -p "$OUT"
{ date -u; echo "commit $ORTHROS_COMMIT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/log"
if [ "${TESTS:-1}" != 0 ]; then  # every GEMV with PDL here, the one-row ones too
  ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=1 timeout -k 10 "$T_TESTS" python3 -m pytest tests/ops/test_gemv.py \
    tests/ops/test_gemv_fused.py tests/ops/test_decode.py tests/engine/test_engine_gemv.py tests/engine/test_decode_compile_options.py \
    tests/engine/test_decode_qkv_kernel.py -m gpu -n 6 \
    -p no:cacheprovider -rfE -W ignore > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests (ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=1): exit=$? $(grep -E '[0-9]+ (passed|failed)' "$OUT/gpu_tests.log" | tail -1)" | tee -a "$OUT/log"
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
[ -z "$VARIANTS" ] || python3 benchmarks/ab_summary.py "$OUT" --base off 2>&1 | tee -a "$OUT/log"
if [ "${ROOF:-0}" -ge 1 ]; then  # the roofline's decode section with the defaults (PDL on for >= 2 rows), gpt-fast at 1K;
  # ROOF=N > 1: N - 1 more processes of the pair and gpt-fast at 1K only (the peer's spread across processes)
  for r in $(seq 1 "$ROOF"); do
    R=$OUT/roofline$([ "$r" = 1 ] || echo "-$r"); mkdir -p "$R"
    if [ "$r" = 1 ]; then sys=orthros+gemv,full+gemv,gpt-fast ctx=(); else sys=orthros+gemv,gpt-fast ctx=(--contexts 1024); fi
    timeout -k 10 "${T_ROOF:-300}" python3 benchmarks/roofline.py --sections decode --gemv "${ctx[@]}" \
      --systems "$sys" --gpt-fast-dir "${GPT_FAST:-.gpu/gpt-fast}" --out "$R" > "$R/log.txt" 2>&1
    echo "roofline decode $r (defaults, $sys): exit=$?" | tee -a "$OUT/log"
    grep -v "it/s\|it \[" "$R/log.txt" | tail -n 30 | tee -a "$OUT/log"
    rm -f "$R"/*.tmp "$R"/*.tmp.png
  done
fi
if [ -n "${PROFILE:-}" ]; then  # the 1K step kernel by kernel, one process a setting of PROFILE (e.g. "pf4m2 pf4m2nocombo")
  for v in $PROFILE; do
    settings "$v"
    env "${env_[@]}" timeout -k 10 "${T_PROFILE:-120}" python3 benchmarks/profile_engine.py --compile --gemv --timeline --context 1024 \
      "${args_[@]}" --json "$OUT/profile_$v.json" > "$OUT/profile_$v.log" 2>&1
    echo "profile $v (${env_[*]} ${args_[*]}): exit=$?" | tee -a "$OUT/log"
    grep -E '^== |graph timeline' "$OUT/profile_$v.log" | tee -a "$OUT/log"
  done
fi
# one archive of the per-process folders and the roofline's (a call returns at most 8 files)
(cd "$OUT" && shopt -s nullglob && dirs=([0-9]*-* [r]oofline*) && [ ${#dirs[@]} -gt 0 ] \
  && tar czf runs.tgz "${dirs[@]}" && rm -rf "${dirs[@]}")
ls -la "$OUT"
