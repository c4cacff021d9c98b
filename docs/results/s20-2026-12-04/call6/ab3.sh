set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=2 ORTHROS_GEMV_PREFETCH_MB=4
i=0
for v in glu glu+downA glu+downC noglu; do
  i=$((i+1)); D=$OUT/$i-$v; mkdir -p $D
  extra=(); case $v in *+*) extra=(--gemv-configs .gpu/${v#*+}.json) ;; esac
  g=1; [ $v = noglu ] && g=0
  ORTHROS_GEMV_GLU_OUT=$g timeout -k 5 60 python3 benchmarks/roofline.py --sections decode --gemv --systems orthros+gemv --contexts 1024 "${extra[@]}" --out $D > $D/log.txt 2>&1
  echo "$i $v exit=$? $(grep -E '^# issue 18' $D/log.txt | sed 's/.*copy/copy/') $(grep -E 'decode orthros\+gemv B=1 L=1024: ' $D/log.txt | tail -1 | sed 's/.*decode orthros/orthros/' | cut -c1-80)" | tee -a $OUT/summary
  rm -f $D/*.tmp*
done
(cd $OUT && tar czf all.tgz [0-9]*-* && rm -rf [0-9]*-*)
