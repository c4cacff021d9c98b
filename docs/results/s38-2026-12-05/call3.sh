# call 3 (carry .gpu/gpt-fast): call 2 again with the engine's Orthros pair timed in the same process, before the
# first of the peer's six setups and after the last (peer_placement.py --pair, ~360 s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 540 python3 docs/results/s38-2026-12-05/peer_placement.py --pair --out $OUT/placement.json 2>&1 \
  | grep -v -E "Warning|warn_once|^\[decode\]" | tee $OUT/placement.log
