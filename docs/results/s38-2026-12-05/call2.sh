# call 2 (carry .gpu/gpt-fast): the peer's step in one process, over two weight allocations and three CUDA
# graphs (activation pools) each (peer_placement.py, ~300 s); Inductor's cache is the machine's default
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 420 python3 docs/results/s38-2026-12-05/peer_placement.py --out $OUT/placement.json 2>&1 \
  | grep -v Warning | tee $OUT/placement.log
