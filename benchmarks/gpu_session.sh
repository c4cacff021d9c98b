#!/usr/bin/env bash
# One device call that checks and times what CPU CI cannot, on a 2-GPU H200 machine:
#   GPU 0: the GPU tests (model with kernels vs reference, kernel hypothesis sweep, decode)
#   GPU 1: training throughput at the paper's 1.3B shape (Transformer vs Orthros), then the
#          engine's prefill / decode benchmark on the Qwen3-8B shape
#   both : a short FSDP2 training run over 2 GPUs (torchrun, NCCL)
# Usage (from the repo root):  ORTHROS_COMMIT=<sha> OUT=<dir> bash benchmarks/gpu_session.sh
# Wheels missing on the machine (datasets, dill, multiprocess) may be put in .whl/.
set -u
OUT=${OUT:-/tmp/orthros-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export ORTHROS_COMMIT=${ORTHROS_COMMIT:-unknown}
T_TESTS=${T_TESTS:-170} T_TRAIN=${T_TRAIN:-70} T_ENGINE=${T_ENGINE:-100} T_FSDP=${T_FSDP:-60}
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; } \
  2>&1 | tee "$OUT/env.txt"

( CUDA_VISIBLE_DEVICES=0 timeout "$T_TESTS" python3 -m pytest tests/test_model_gpu.py tests/test_triton_kernels.py \
    tests/test_decode_op.py -m gpu -n 6 -p no:cacheprovider -q > "$OUT/gpu_tests.log" 2>&1
  echo "exit=$?" >> "$OUT/gpu_tests.log" ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout "$T_TRAIN" python3 benchmarks/train_throughput.py --arch transformer orthros --steps 8 --warmup 3 \
    --out "$OUT/train_throughput.jsonl" > "$OUT/train_throughput.log" 2>&1
  echo "exit=$?" >> "$OUT/train_throughput.log"
  timeout "$T_ENGINE" python3 -m orthros bench all --lengths 8192,32768,131072 --budget-s 1 \
    --contexts 8192,32768,131072 --batch-sizes 1,2 --steps 20 --pairs 1024:256 --out "$OUT/engine" \
    > "$OUT/engine.log" 2>&1
  echo "exit=$?" >> "$OUT/engine.log" ) &
wait

timeout "$T_FSDP" torchrun --nproc-per-node 2 -m orthros.train configs/tiny_cpu_pt.yaml --train.max_steps 30 \
  --train.eval_every 15 --checkpoint.every 30 --output_dir /tmp/fsdp_run > "$OUT/fsdp.log" 2>&1
echo "exit=$?" >> "$OUT/fsdp.log"
# at most 8 files come back: pack the engine's JSON and plots into one
tar czf "$OUT/engine.tgz" -C "$OUT" engine 2>/dev/null && rm -rf "$OUT/engine"
tail -n 5 "$OUT"/*.log
