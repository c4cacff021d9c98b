# call 6: processes 5 and 6 on the same warm machine right after call 5 (~200 s of device time left)
exec bash docs/results/s37-2026-12-05/call5.sh 5 6
