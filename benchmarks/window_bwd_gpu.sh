#!/usr/bin/env bash
# Issue #18, target 3 (the window stream's fwd+bwd against Flex) in one GPU call of < 600 s on one
# H200: the GPU tests of the two-launch backward; `attention.py --window-tune --window-bwd-only` over
# the backward candidates (CANDIDATES); the candidate with the least fwd+bwd time summed over 32K and
# 128K (8K is host-bound eagerly) is then run through the roofline's window section
# (--window-bwd-config: ours against Flex, with the floors), and ncu reports its backward launches'
# registers and spills. Everything lands in $OUT. From the repo root (the `run` tool):
#   command: ORTHROS_COMMIT=<sha> bash benchmarks/window_bwd_gpu.sh
# Optional: CANDIDATES (comma-separated names of benchmarks/attention.py WINDOW_BWD_CANDIDATES),
# T_TUNE (200 s), T_ROOF (200 s; ROOF=0 skips the roofline), NCU (1; 0 skips the Nsight Compute
# report), TESTS (pytest -k of the GPU tests run first; "two_launch or bwd_config"), T_TESTS (90 s),
# PYTEST_ARGS (extra pytest arguments, e.g. "-n 4"), FWD_CANDIDATES (names of WINDOW_FWD_CANDIDATES:
# the forward variants at 8K-1M next to Flex after the backward tune) and T_FWD (200 s).
set -u
OUT=${OUT:-/tmp/window-bwd}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
T_TUNE=${T_TUNE:-200} T_ROOF=${T_ROOF:-200}
CANDIDATES=${CANDIDATES:-"dkdv 32x64 w4,two-launch,2-launch dkdv 64x32 w8,2-launch dkdv 32x64 w8,2-launch dkdv 32x32 w4,2-launch dkdv 16x64 w4,2-launch dkdv 32x32 w8"}
{ date -u; echo "commit $ORTHROS_COMMIT"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/log"
timeout -k 10 "${T_TESTS:-90}" python3 -m pytest tests/ops/test_triton.py -k "${TESTS:-two_launch or bwd_config}" -q -p no:cacheprovider -W ignore \
  ${PYTEST_ARGS:-} > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit=$? $(grep -cE '^\.|passed' "$OUT/gpu_tests.log") $(tail -1 "$OUT/gpu_tests.log")" | tee -a "$OUT/log"
timeout -k 10 "$T_TUNE" python3 benchmarks/attention.py --window-tune --window-bwd-only --window-candidates "$CANDIDATES" \
  --json "$OUT/window_tune.json" > "$OUT/window_tune.log" 2>&1
echo "window tune: exit=$?" | tee -a "$OUT/log"
grep -E "^ +[0-9]+ |best|flex" "$OUT/window_tune.log" | tee -a "$OUT/log"
if [ -n "${FWD_CANDIDATES:-}" ]; then
  timeout -k 10 "${T_FWD:-200}" python3 benchmarks/attention.py --window-tune --window-fwd-only \
    --window-fwd-candidates "$FWD_CANDIDATES" --json "$OUT/window_fwd.json" > "$OUT/window_fwd.log" 2>&1
  echo "window forward variants: exit=$?" | tee -a "$OUT/log"
  grep -E "^ +[0-9]+ |fastest|winner" "$OUT/window_fwd.log" | tee -a "$OUT/log"
fi
[ "${ROOF:-1}" = 1 ] || { date -u | tee -a "$OUT/log"; exit 0; }
# the winner over 32K + 128K, as a --window-bwd-config (the candidates' overrides and fused flag)
CFG=$(python3 - "$OUT/window_tune.json" <<'PY'
import json, sys
sys.path.insert(0, "benchmarks")
import attention as A
tune = json.load(open(sys.argv[1]))["results"]["window_tune"]
total = {}
for T in ("T32768", "T131072"):
    for name, row in tune.get(T, {}).items():
        if isinstance(row, dict) and row.get("fb"):
            total[name] = total.get(name, 0.0) + row["fb"]
variant = {n: d for n, o, f, d in A.WINDOW_BWD_CANDIDATES}
full = {n: t for n, t in total.items()  # timed at both lengths; not the GQA-packed dQ (its own blocks)
        if all(n in tune.get(T, {}) for T in ("T32768", "T131072")) and not variant.get(n, "").startswith("gqa")}
best = min(full, key=full.get)
over, fused, dq = next((o, f, d) for n, o, f, d in A.WINDOW_BWD_CANDIDATES if n == best)
print(f"best {best}: {full[best]:.3f} ms (base {full.get('base', float('nan')):.3f})", file=sys.stderr)
cfg = {k: list(v) for k, v in over.items() if k in ("bwd_dkdv", "bwd_dq")}
cfg["fused"] = fused
dq_v, _, kv_v = dq.partition(":")
cfg["dq_variant"] = dq_v
if kv_v:
    cfg["dkdv_variant"] = kv_v
print(json.dumps(cfg))
PY
) 2>>"$OUT/log"
tail -1 "$OUT/log"
echo "window-bwd-config: $CFG" | tee -a "$OUT/log"
mkdir -p "$OUT/roofline"
timeout -k 10 "$T_ROOF" python3 benchmarks/roofline.py --sections window --window-bwd-config "$CFG" \
  --deadline-s $((T_ROOF - 30)) --out "$OUT/roofline" > "$OUT/roofline/log.txt" 2>&1
echo "roofline window: exit=$?" | tee -a "$OUT/log"
rm -f "$OUT/roofline"/*.tmp "$OUT/roofline"/*.tmp.png
grep -E "window|targets|met" "$OUT/roofline/log.txt" | grep -v "it/s" | tail -n 30 | tee -a "$OUT/log"
if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
  # the third fwd+bwd's backward: one launch each when fused, two otherwise
  N=$(python3 -c "import json,sys; print(1 if json.loads(sys.argv[1])['fused'] else 2)" "$CFG")
  timeout -k 5 60 ncu --kernel-name regex:_stream_bwd --launch-skip $((2 * N)) --launch-count "$N" --section LaunchStats \
    --section MemoryWorkloadAnalysis --section SpeedOfLight python3 benchmarks/window_bwd_ncu.py "$CFG" > "$OUT/ncu.log" 2>&1
  echo "ncu ($CFG): exit=$?" | tee -a "$OUT/log"
  grep -E "bwd_dkdv|_stream_bwd|Duration|Registers Per|Spilling Requests  |Grid Size" "$OUT/ncu.log" | tee -a "$OUT/log"
fi
date -u | tee -a "$OUT/log"
