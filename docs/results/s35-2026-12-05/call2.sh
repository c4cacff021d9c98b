# call 2: the 1K step's timeline, kernel by kernel, of the default and the two correct preload forms
# (one process each; call 1 is docs/results/s34-2026-12-05/call1.sh with the A/B of its README)
OUT=$OUT TESTS=0 VARIANTS="" PROFILE="${PROFILE:-pf4m2 pf4m2wp20late pf4m2wp20m}" exec bash benchmarks/pdl_gpu.sh
