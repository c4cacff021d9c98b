#!/usr/bin/env bash
# The SmolLM2 protocol (benchmarks/smollm2_cpt.py) on a lent GPU machine that has no registry, over
# calls made back to back while the machine stays warm ($HOME survives between them, a carried
# folder does not). The 98 MB GGUF is over one call's 64 MiB carry limit (tracked files included:
# 14.6 MB at 2026-12-03), so it travels in two parts, and the CPT data rides with the second. The
# parts may be of the GGUF itself or of its gzip stream (92.6 MB: `gzip -1 -c model.gguf | split
# -b 49000000 - part`), which leaves room for the data (8.3 MB gzipped) beside the second part.
# Carried in .gpu/ (ignored), each file named in `carry`:
#   part 1: .gpu/gguf.partA, .gpu/src.tar.gz (git archive of the commit to measure: orthros, benchmarks,
#           configs, pyproject.toml), .gpu/COMMIT (that commit's id, for the results' metadata) and
#           .whl/ (gguf, datasets, dill, multiprocess wheels)
#   part 2: .gpu/gguf.partB, .gpu/data.tar.gz (prepare's output folder, tar -czf ... -C DIR .)
#   bash benchmarks/smollm2_gpu.sh part1     # stage into $HOME/smol, install wheels, smoke run on a tiny GGUF
#   bash benchmarks/smollm2_gpu.sh part2 [protocol args...]   # join + verify the GGUF, unpack the data, run
#                                                             # (again: an earlier run's $HOME/smol/work is
#                                                             # moved to $HOME/smol/work.earlier first)
#   bash benchmarks/smollm2_gpu.sh more [protocol args...]    # another call of the same run (same --work):
#                                                             # e.g. --phases train,ppl,niah --cpt-runs base_cpt
set -euo pipefail
H=$HOME/smol
# the archive has no .git: the commit the results name comes from .gpu/COMMIT (kept in $H by part 1)
commit() { if [ -f .gpu/COMMIT ]; then cp .gpu/COMMIT "$H/COMMIT"; fi
           export ORTHROS_COMMIT=${ORTHROS_COMMIT:-$(cat "$H/COMMIT" 2>/dev/null || echo unknown)}; }
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
case "${1:-}" in
part1)
  rm -rf "$H" && mkdir -p "$H/src" "$H/smoke-data"
  cp .gpu/gguf.partA "$H/"
  tar -xzf .gpu/src.tar.gz -C "$H/src"
  commit
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$H/site" .whl/*.whl
  export PYTHONPATH="$H/src:$H/site"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -m pip show pyarrow fsspec pandas 2>/dev/null | grep -E "^(Name|Version)" | paste - - || true
  python3 - <<'PY'
import torch, transformers, datasets, gguf, sys
print("torch", torch.__version__, "transformers", transformers.__version__, "datasets", datasets.__version__,
      "python", sys.version.split()[0])
from pathlib import Path
import os
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from orthros.conversion.gguf import write_llama_gguf
H = Path(os.environ["HOME"]) / "smol"
tok = AutoTokenizer.from_pretrained(str(H / "src/orthros/data/tokenizer"))
torch.manual_seed(0)
m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                 tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
write_llama_gguf(m, tok, H / "tiny.gguf")
# smoke data: the embedded corpus (the real CPT data arrives with part 2)
import json
corpus, d = H / "src/orthros/data/corpus", H / "smoke-data"
(d / "train.jsonl").write_text((corpus / "shakespeare_train.jsonl").read_text())
(d / "heldout.jsonl").write_text((corpus / "shakespeare_eval.jsonl").read_text())
plays = [json.loads(x)["text"] for x in (corpus / "shakespeare_eval.jsonl").read_text().splitlines()]
(d / "haystack.txt").write_text("".join(c for c in "\n".join(plays) if not c.isdigit()))
PY
  python3 "$H/src/benchmarks/smollm2_cpt.py" run --gguf "$H/tiny.gguf" --data "$H/smoke-data" --out "$OUT/smoke" \
    --work "$H/smoke" --seq-len 1024 --micro-batch 2 --probe-steps 3 --max-steps 10 --curve-points 3 \
    --ppl-windows 2 --eval-sequences 2 --niah-max 2048 --niah-samples 1 --window 64 2>&1 | grep --line-buffered -v "it/s\]"
  ;;
part2)
  shift
  cat "$H/gguf.partA" .gpu/gguf.partB > "$H/model.part"
  if gzip -t "$H/model.part" 2>/dev/null; then gzip -dc "$H/model.part" > "$H/model.gguf" && rm "$H/model.part"
  else mv "$H/model.part" "$H/model.gguf"; fi
  echo "$GGUF_SHA  $H/model.gguf" | sha256sum -c -
  rm -rf "$H/data" && mkdir -p "$H/data" && tar -xzf .gpu/data.tar.gz -C "$H/data"
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print('data:', {k: m[k] for k in ('documents', 'characters', 'sha256') if k in m})" \
    "$H/data/manifest.json" || true
  if [ -f .gpu/src.tar.gz ]; then rm -rf "$H/src" && mkdir -p "$H/src" && tar -xzf .gpu/src.tar.gz -C "$H/src"; fi
  commit
  export PYTHONPATH="$H/src:$H/site"
  # part2 starts a run afresh (its phases convert), and the protocol refuses a --work that holds an earlier
  # run's CPT (it would resume from it, or score it beside this one): an earlier part2's folder on this warm
  # machine is moved aside, not mixed in, not deleted (only the one before it). A part2 without convert in
  # its --phases continues the run in $H/work, as `more` does.
  phases=$(python3 -c 'import argparse, sys
p = argparse.ArgumentParser(add_help=False)  # (the protocol parser: the same abbreviations)
p.add_argument("--phases", default="convert")
print(p.parse_known_args(sys.argv[1:])[0].phases)' "$@" 2>/dev/null) || phases=  # (bad: the protocol says so)
  if [[ ",$phases," == *,convert,* ]] && [ -e "$H/work" ]; then
    rm -rf "$H/work.earlier" && mv "$H/work" "$H/work.earlier"
    echo "part2: $H/work held an earlier run; this part2 starts afresh, the earlier run is now in $H/work.earlier" \
         "(\`more\` continues a run: to continue that one, move it back to $H/work and call more)" >&2
  fi
  python3 "$H/src/benchmarks/smollm2_cpt.py" run --gguf "$H/model.gguf" --data "$H/data" --out "$OUT" \
    --work "$H/work" "$@" 2>&1 | grep --line-buffered -v "it/s\]"
  ;;
more)
  shift
  [ -f "$H/model.gguf" ] && [ -d "$H/work" ] || { echo "more: no earlier part2 on this machine ($H)" >&2; exit 2; }
  commit
  export PYTHONPATH="$H/src:$H/site"
  python3 "$H/src/benchmarks/smollm2_cpt.py" run --gguf "$H/model.gguf" --data "$H/data" --out "$OUT" \
    --work "$H/work" "$@" 2>&1 | grep --line-buffered -v "it/s\]"
  ;;
*) echo "usage: $0 part1 | part2 [protocol args] | more [protocol args]" >&2; exit 2 ;;
esac
