# call 4 (carry .gpu/gpt-fast): the GPU tests of the GEMV, decode and engine files at HEAD (kernel.py's config
# lookup changed: exact-shape overrides, installed tables as layers), then the roofline's decode section 1K-128K
# with gpt-fast at 1K and one more process of the pair and gpt-fast at 1K; everything written under one folder
# and returned as one archive ($OUT returns at most 8 files)
D=/tmp/call4; mkdir -p "$D"
OUT=$D TESTS=1 T_TESTS=140 ROOF=2 T_ROOF=200 VARIANTS="" ORTHROS_COMMIT=${ORTHROS_COMMIT:?} bash benchmarks/pdl_gpu.sh
tar czf "$OUT/call4.tgz" -C "$D" .
