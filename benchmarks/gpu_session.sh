#!/usr/bin/env bash
# One device call that checks and times what CPU CI cannot, on a 2-GPU H200 machine (~8 min):
#   GPU 0: the GPU tests (model with kernels vs reference, generate() through the engine, kernel
#          hypothesis sweep, decode op), then the kernel target rows (benchmarks/attention.py)
#   GPU 1: training throughput at the paper's 1.3B shape (Transformer vs Orthros), then the
#          engine's prefill / decode / e2e benchmark on the Qwen3-8B shape (compiled engine)
#   both : a short FSDP2 training run over 2 GPUs (torchrun, NCCL)
# Usage (from the repo root):  ORTHROS_COMMIT=<sha> OUT=<dir> bash benchmarks/gpu_session.sh
# Optional: KERNEL_FLAGS (default --targets), ENGINE_FLAGS (extra flags of `orthros bench all`),
# T_* time limits per part. Wheels missing on the machine (datasets, dill, multiprocess) may be
# put in .whl/. Everything lands in $OUT (logs, JSON; plots packed in results.tgz).
set -u
OUT=${OUT:-/tmp/orthros-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
T_TESTS=${T_TESTS:-200} T_KERN=${T_KERN:-230} T_TRAIN=${T_TRAIN:-90} T_ENGINE=${T_ENGINE:-330} T_FSDP=${T_FSDP:-60}
KERNEL_FLAGS=${KERNEL_FLAGS:---targets}
ENGINE_FLAGS=${ENGINE_FLAGS:---compile}
{ date -u; echo "commit $ORTHROS_COMMIT"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; } \
  2>&1 | tee "$OUT/env.txt"
mkdir -p "$OUT/res"

( export CUDA_VISIBLE_DEVICES=0
  timeout "$T_TESTS" python3 -m pytest tests/models/test_modeling_gpu.py tests/ops/test_triton.py tests/ops/test_decode.py \
    -m gpu -n 6 -p no:cacheprovider -q -rfE > "$OUT/gpu_tests.log" 2>&1
  echo "exit=$?" >> "$OUT/gpu_tests.log"
  timeout 120 python3 -m pytest tests/ops/test_triton.py -m gpu_alone -p no:cacheprovider -q -rfE \
    >> "$OUT/gpu_tests.log" 2>&1  # the 1M-token cases, skipped beside other workers
  echo "gpu_alone exit=$?" >> "$OUT/gpu_tests.log"
  timeout "$T_KERN" python3 benchmarks/attention.py $KERNEL_FLAGS --json "$OUT/res/attention.json" \
    > "$OUT/attention.log" 2>&1
  echo "exit=$?" >> "$OUT/attention.log" ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout "$T_TRAIN" python3 benchmarks/train_throughput.py --arch transformer orthros --steps 8 --warmup 3 \
    --out "$OUT/res/train_throughput.jsonl" > "$OUT/train_throughput.log" 2>&1
  echo "exit=$?" >> "$OUT/train_throughput.log"
  timeout "$T_ENGINE" python3 -m orthros bench all --lengths 8192,32768,131072 --budget-s 1 \
    --contexts 1024,8192,32768,131072 --batch-sizes 1,2 --steps 20 --pairs 128:128,1024:1024,8192:1024 \
    --fit 131072:8192 $ENGINE_FLAGS --out "$OUT/res/engine" > "$OUT/engine.log" 2>&1
  echo "exit=$?" >> "$OUT/engine.log" ) &
wait

timeout "$T_FSDP" torchrun --nproc-per-node 2 -m orthros.train configs/tiny_cpu_pt.yaml --train.max_steps 30 \
  --train.eval_every 15 --checkpoint.every 30 --output_dir /tmp/fsdp_run > "$OUT/fsdp.log" 2>&1
echo "exit=$?" >> "$OUT/fsdp.log"
cp /tmp/fsdp_run/metrics.jsonl "$OUT/res/fsdp_metrics.jsonl" 2>/dev/null
# few files come back: pack the JSON and plots into one archive
tar czf "$OUT/results.tgz" -C "$OUT" res 2>/dev/null && rm -rf "$OUT/res"
tail -n 4 "$OUT"/*.log
