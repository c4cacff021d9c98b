# call 3 (carry .gpu .whl): the 1K decode roofline of issue #18 on an H200 only (call1.sh's H200 branch, no tests after
# it); on any other card it prints the card's name and stops.
export PYTHONUNBUFFERED=1 ORTHROS_COMMIT=${ORTHROS_COMMIT:?}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "card: $name commit: $ORTHROS_COMMIT" | tee $OUT/card.log
case "$name" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/card.log
timeout -k 5 300 python3 benchmarks/roofline.py --sections decode --gemv --contexts 1024 \
  --systems orthros+gemv,full+gemv,gpt-fast --gpt-fast-dir .gpu/gpt-fast --gpt-fast-setups 4 --out $OUT/roofline \
  2>&1 | grep -v -E "Warning|warn_once" | tee $OUT/roofline.log | grep -E "^# issue|decode |setups|decode_vs|needs|B=1 L=1024 "
