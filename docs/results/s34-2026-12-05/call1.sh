# call 1 (inference changes 37-39): docs/results/s33-2026-12-05/call1.sh (the GPU tests of both preload forms,
# then the A/B at 1K) cut to a 4-process A/B after two full calls were taken back; VARIANTS overrides the A/B
export VARIANTS="${VARIANTS:-pf4m2 pf4m2wp20 pf4m2wp20m pf4m2}"
exec bash docs/results/s33-2026-12-05/call1.sh
