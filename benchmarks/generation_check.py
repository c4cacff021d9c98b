"""Does a checkpoint generate what its PT form computes, at a long prompt?

For one prompt of ``--length`` tokens (real text: the shipped held-out corpus, or ``--text``),
greedy ``generate`` through the HF cache path (``use_engine=False``) for ``--new`` tokens, then
one forward of the PT form over prompt + generated tokens with output positions at the prompt's
last token and at each generated one: the logits of each step must agree (cached prefill and
decode pairs = the uncached model). With ``--engine`` the inference engine's greedy tokens are
compared too. Prints one line per step and exits 1 on an argmax mismatch or a logit gap above
``--atol``; ``--out`` writes the figures as JSON.

    python benchmarks/generation_check.py --model runs/smollm2-orthros --length 8189 --new 3 --engine

Used on the converted SmolLM2-135M (docs/pretrained.md) to rule out the generation path as the
cause of its passkey misses.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint directory (orthros convert / train output)")
    ap.add_argument("--length", type=int, default=4096, help="prompt tokens (default 4096)")
    ap.add_argument("--new", type=int, default=3, help="generated tokens to check, 1..64 (default 3)")
    ap.add_argument("--text", default=None, help=".txt or .jsonl (field 'text') for the prompt (default: the shipped held-out corpus)")
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="fp32 (default) or bf16")
    ap.add_argument("--atol", type=float, default=1e-3, help="largest logit gap allowed per step (default 1e-3; bf16 wants ~0.5)")
    ap.add_argument("--engine", action="store_true", help="also compare the inference engine's greedy tokens")
    ap.add_argument("--out", default=None, help="JSON path for the figures")
    a = ap.parse_args(argv)
    if not Path(a.model).is_dir():
        ap.error(f"--model: {a.model!r} is not a directory")
    if a.length < 2:
        ap.error(f"--length must be >= 2, got {a.length}")
    if not 1 <= a.new <= 64:
        ap.error(f"--new must be in 1..64, got {a.new}")
    if not a.atol > 0:
        ap.error(f"--atol must be > 0, got {a.atol}")
    if a.text is not None and not Path(a.text).is_file():
        ap.error(f"--text: {a.text!r} is not a file")
    from orthros.utils import check_device, check_output_path

    try:
        a.device = check_device(a.device)
        if a.out is not None:  # was: found by the write, after the model ran
            check_output_path("--out", a.out)
    except ValueError as e:
        ap.error(str(e))
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    from transformers import AutoTokenizer

    from orthros.evaluation.common import load_model
    from orthros.evaluation.niah import CORPUS_FILE
    from orthros.evaluation.perplexity import load_documents
    from orthros.utils import commit_id, write_json

    try:
        text = "\n".join(load_documents(a.text or CORPUS_FILE, arg="--text"))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    tok = AutoTokenizer.from_pretrained(a.model)
    model = load_model(a.model).to(a.device, torch.float32 if a.dtype == "fp32" else torch.bfloat16).eval()
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and a.length + a.new - 1 > limit:  # the last new token is never fed back
        print(f"--length {a.length} + --new {a.new} - 1 exceeds the model's max_position_embeddings = {limit} "
              f"(use --length <= {limit + 1 - a.new})", file=sys.stderr)
        return 2
    ids = tok(text, return_tensors="pt").input_ids[:, :a.length].to(a.device)
    if ids.shape[1] < a.length:
        print(f"the text has only {ids.shape[1]} tokens, fewer than --length {a.length}", file=sys.stderr)
        return 2
    T, t0 = a.length, time.perf_counter()
    with torch.no_grad():
        g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new, min_new_tokens=a.new,
                           do_sample=False, use_engine=False, output_logits=True, return_dict_in_generate=True,
                           pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else 0)
        new = g.sequences[0, T:].tolist()
        full = g.sequences[:, :T + a.new - 1]
        pt = model(input_ids=full, output_positions=torch.arange(T - 1, T + a.new - 1, device=a.device)[None]).logits[0]
    steps, ok = [], True
    for i in range(a.new):
        hf, ref = g.logits[i][0].float(), pt[i].float()
        gap, scale = (hf - ref).abs().max().item(), ref.abs().max().item()
        same = bool(hf.argmax() == ref.argmax())
        ok &= same and gap <= a.atol
        steps.append({"step": i, "max_logit_gap": gap, "logit_scale": scale, "argmax_equal": same})
        print(f"step {i}: |generate - PT form| max {gap:.3e} (logits up to {scale:.1f}), "
              f"argmax equal: {same}", flush=True)
    res = {"model": a.model, "length": T, "new_tokens": new, "dtype": a.dtype, "device": a.device,
           "commit": commit_id(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "steps": steps}
    if a.engine:
        from orthros.engine import Engine

        eng = Engine(model, max_batch_size=1, max_seq_len=T + a.new - 1)
        etoks = list(eng.generate([ids[0].tolist()], max_new_tokens=a.new)[0])
        res["engine_tokens"], res["engine_equal"] = etoks, etoks == new
        ok &= etoks == new
        print(f"engine tokens {etoks} {'=' if etoks == new else '!='} generate's {new}", flush=True)
    res["ok"], res["seconds"] = bool(ok), round(time.perf_counter() - t0, 1)
    if a.out:
        write_json(a.out, res)
    print(("OK" if ok else "MISMATCH") + f" ({res['seconds']} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
