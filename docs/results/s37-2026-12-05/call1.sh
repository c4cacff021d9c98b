# call 1 of the thirty-seventh session: the thirty-sixth session's call5.sh, run unchanged at 9a49b11 (carry
# .gpu/gpt-fast; its comment says what it runs)
exec bash docs/results/s36-2026-12-05/call5.sh
