# call 4: read_stream.py as kept (the contiguous-run form only) on the GPU: its test, then the ceiling twice with the
# copy beside it (~40 s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 60 python3 -m pytest -p no:cacheprovider -o addopts="" -q -m gpu tests/benchmarks/test_read_stream.py \
  2>&1 | tail -2 | tee $OUT/gpu_tests.log
timeout -k 5 120 python3 - <<'PY' 2>&1 | tee $OUT/read.log
import torch
from orthros.benchmarks.inference import copy_bandwidth
from orthros.benchmarks.read_stream import read_bandwidth
dev = torch.device("cuda")
for i in range(2):
    bw = copy_bandwidth(dev, 2**30)
    r = read_bandwidth(dev)
    print(f"round {i}: copy {bw / 1e12:.3f} TB/s, read {r['bytes_per_s'] / 1e12:.3f} TB/s "
          f"({100 * r['bytes_per_s'] / bw:.1f}% of the copy) by {r['how']}")
    print("  " + ", ".join(f"{how} {b / 1e12:.3f}" for how, b in sorted(r["candidates"], key=lambda c: -c[1])))
PY
