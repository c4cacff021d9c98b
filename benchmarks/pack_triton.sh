#!/usr/bin/env bash
# Pack the Triton release fla-core needs for its gated backward on Hopper (>= 3.7.1; fla issue
# #640) into one file that fits a lent GPU machine's carry limit (64 MiB), for the fla-vs-PyTorch
# gradient tests. The H200 image ships Triton 3.6 and has no registry, so fla-core refuses those
# gradients there and `backend="auto"` trains through the pure-PyTorch GDN.
#
# What is dropped from the 198 MB wheel (nothing the fla kernels use): the Blackwell ptxas, CUPTI
# and the proton profiler, the instrumentation test library, __pycache__; libtriton.so is stripped
# of its static symbols (461 -> 180 MB) and everything is xz-compressed: ~52 MB.
#
#   bash benchmarks/pack_triton.sh                # -> .whl/triton-3.7.1-slim.tar.xz (registry download)
#
# On the GPU machine (carry the file and .whl/fla_core-0.6.0-py3-none-any.whl):
#   mkdir -p /tmp/site37 && tar -xJf .whl/triton-3.7.1-slim.tar.xz -C /tmp/site37
#   PYTHONPATH=/tmp/site37:/tmp/site:$PWD python3 -m pytest -n 7 tests/ops/test_gdn.py -k "every_gradient or causal_conv1d_fla"
# Only that test process sees the newer Triton; the benchmarks keep the image's own.
set -euo pipefail
VERSION=${TRITON_VERSION:-3.7.1}
PY=${PYTHON_VERSION:-3.12}          # the GPU image's Python
DEST=${DEST:-.whl/triton-$VERSION-slim.tar.xz}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary :all: --python-version "$PY" \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 "triton==$VERSION" -d "$work"
mkdir "$work/x" && (cd "$work/x" && python3 -m zipfile -e "$work"/triton-*.whl .)
t="$work/x/triton"
rm -rf "$t/backends/nvidia/bin/ptxas-blackwell" "$t/backends/nvidia/lib/cupti" "$t/_C/libproton.so" "$t/instrumentation"
find "$work/x" -name __pycache__ -prune -exec rm -rf {} +
chmod +x "$t/backends/nvidia/bin/"* "$t/_C/"*.so
strip --strip-unneeded "$t/_C/libtriton.so"
mkdir -p "$(dirname "$DEST")"
tar -C "$work/x" -cf - triton "triton-$VERSION.dist-info" | xz -T0 -6 > "$DEST.tmp"
mv "$DEST.tmp" "$DEST"
ls -la "$DEST"
