# call 3: the read ceiling's kernel with contiguous runs a program (the "cN" configs) beside the grid-strided ones,
# and the LM head's GEMV sweep on the same machine, so the ceiling is judged against the fastest GEMV stream (~240 s)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout -k 5 60 python3 -m pytest -p no:cacheprovider -o addopts="" -q -m gpu tests/benchmarks/test_read_stream.py \
  2>&1 | tail -2 | tee $OUT/gpu_tests.log
timeout -k 5 120 python3 - <<'PY' 2>&1 | tee $OUT/read.log
import json, os, torch
from orthros.benchmarks.inference import copy_bandwidth
from orthros.benchmarks.read_stream import read_bandwidth
dev = torch.device("cuda")
for i in range(2):
    bw = copy_bandwidth(dev, 2**30)
    r = read_bandwidth(dev)
    print(f"round {i}: copy {bw / 1e12:.3f} TB/s, read {r['bytes_per_s'] / 1e12:.3f} TB/s "
          f"({100 * r['bytes_per_s'] / bw:.1f}% of the copy) by {r['how']}")
    for how, b in sorted(r["candidates"], key=lambda c: -c[1]):
        print(f"  {b / 1e12:.3f}  {how}")
    json.dump({"copy_bw": bw, **r}, open(os.path.join(os.environ["OUT"], f"read{i}.json"), "w"))
PY
timeout -k 5 300 python3 benchmarks/gemv.py --shapes lm_head --sweep --deadline-s 200 --out $OUT/gemv_lm_head.json \
  2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/gemv.log | tail -12
