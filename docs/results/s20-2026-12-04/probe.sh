set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" ORTHROS_PDL=1 ORTHROS_PDL_MIN_M=2 ORTHROS_GEMV_PREFETCH_MB=4
i=0
for v in ${PROBES:-default 64,128,4 64,256,2 default 64,128,4 64,256,2}; do
  i=$((i+1)); D=$OUT/$i-${v//,/x}; mkdir -p $D
  pq=$v pd= pn=; [ $v = default ] && pq=; [ $v = down ] && pq= pd=1; [ $v = nonorm ] && pq= pn=1; pc=; [ $v = nocomb ] && pq= pc=1
  PROBE_NOCOMB=$pc PROBE_NONORM=$pn PROBE_DOWN=$pd PROBE_QKV=$pq timeout -k 5 ${T_CELL:-62} python3 .gpu/qkv_probe.py --sections decode --gemv --systems orthros+gemv --contexts 1024 --out $D > $D/log.txt 2>&1
  echo "$i $v exit=$? $(grep -E '^# issue 18' $D/log.txt | sed 's/.*copy/copy/') $(grep -E 'decode orthros\+gemv B=1 L=1024: ' $D/log.txt | tail -1 | sed 's/.*decode orthros/orthros/' | cut -c1-80)" | tee -a $OUT/summary
  rm -f $D/*.tmp*
done
(cd $OUT && tar czf all.tgz [0-9]*-* && rm -rf [0-9]*-*)
