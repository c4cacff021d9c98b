# call 4 (carry .gpu .whl), whichever card comes: the 1K decode roofline of issue #18 (on an H200 the target-1
# figure; on an H100 a same-run ratio there), run after this session's benchmark changes (benchmarks._free collects
# on CUDA only; profile_engine / attention take main(argv)); then profile_engine's decode smoke with the peer.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/card.log
timeout -k 5 300 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
  --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
  2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 "
echo "roofline exit=${PIPESTATUS[0]}"
timeout -k 5 150 python3 benchmarks/profile_engine.py --phase decode --compile --gemv --context 1024 --json $OUT/profile.json \
  2>&1 | grep -v -E "Warning|warn_once" | tail -15 | tee $OUT/profile.log
echo "profile_engine exit=${PIPESTATUS[0]}"
