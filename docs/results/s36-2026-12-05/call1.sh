# call 1: the GPU tests at HEAD, then the roofline's decode section with gpt-fast at 1K and two more
# processes of the pair and gpt-fast at 1K (carry .gpu/gpt-fast)
OUT=$OUT TESTS=1 T_TESTS=140 ROOF=3 T_ROOF=200 VARIANTS="" ORTHROS_COMMIT=${ORTHROS_COMMIT:?} \
  exec bash benchmarks/pdl_gpu.sh
