"""``orthros info PATH``: what an Orthros checkpoint is, read without loading its weights.

It prints the model (kind, window, layers, shape, positions), the weights (parameters, dtypes,
files, each file's header checked against its size), whether a tokenizer and a chat template
and the remote code are there, whether the vLLM plugin serves it, where the checkpoint came
from (``conversion_report.json`` of ``orthros convert``, ``manifest.json`` of a training
checkpoint), the cache a request of ``--batch-size`` rows of ``--max-seq-len`` tokens needs in
the engine, and the FLOPs of a prefill of ``--max-seq-len`` tokens (attention, and the whole
forward) against the same layers with full attention. ``--verify`` checks a
training checkpoint's files against the sha256 sums of its manifest. ``--json`` prints the same
as one JSON object. Bad input (not a directory, not an Orthros checkpoint, a GGUF file of an architecture
``orthros convert`` does not take (another GGUF: "convert it first"), a damaged weight
file, weights that lack a tensor of config.json's model or hold one of another shape, a training
checkpoint whose manifest.json is corrupt or names a file that is missing or of another size) is
one line and exit code 2, as for every command. Nothing is written.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
from collections import Counter
from pathlib import Path

from .kinds import (ATTENTION_LAYER_TYPES, LINEAR_LAYER_TYPE, describe_layers, model_kind, window_of,
                    with_attention_mode)
from .utils import DTYPE_CHOICES, check_positive_int, format_bytes, to_json

# safetensors dtype -> the short name CLIs use (floating dtypes a cache can have)
_SHORT = {"BF16": "bf16", "F16": "fp16", "F32": "fp32"}

def _vllm_backends(config) -> tuple:
    """``(backends, why_not)``: where the vLLM plugin serves ``config`` ("cpu", "gpu"), and why nowhere
    (``backends`` empty) or why not on the CPU (``backends`` is ``("gpu",)``)."""
    from .serving import CPU_ATTENTION_HEAD_DIMS, check_servable, is_hybrid

    try:
        check_servable(config)
    except ValueError as e:
        return (), str(e)
    d = config.head_dim
    cpu = d in CPU_ATTENTION_HEAD_DIMS
    gpu = not is_hybrid(config) and (d >= 32 or d % 8 == 0)  # the hybrid: CPU backend only, so far
    dims = ", ".join(map(str, CPU_ATTENTION_HEAD_DIMS))
    if cpu:
        return ("cpu", "gpu") if gpu else ("cpu",), None
    if gpu:
        return ("gpu",), f"vLLM's CPU attention takes head_dim {dims}; this checkpoint has head_dim={d}"
    if is_hybrid(config):
        return (), (f"the vLLM Orthros model serves Gated DeltaNet models on the CPU backend only, whose attention "
                    f"takes head_dim {dims}; this checkpoint has head_dim={d}")
    return (), (f"no vLLM attention backend it runs on takes head_dim={d} (CPU: {dims}; GPU: TRITON_ATTN 32 and "
                f"up, FLASH_ATTN multiples of 8)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="orthros info",
        description="Describe an Orthros checkpoint directory without loading its weights: the model, its weights "
                    "(each file's header checked against its size), tokenizer, remote code, where it came from, "
                    "whether vLLM serves it, the engine's cache for a request, and a prefill's FLOPs against a "
                    "Transformer's.")
    p.add_argument("path", metavar="PATH", help="an Orthros checkpoint directory (save_pretrained, orthros convert, "
                                                "or a training checkpoint)")
    p.add_argument("--max-seq-len", type=int, default=None, metavar="N",
                   help="tokens per row for the cache and prefill figures (default: the model's "
                        "max_position_embeddings)")
    p.add_argument("--batch-size", type=int, default=1, metavar="B", help="rows of the cache figure (default: 1)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default=None,
                   help="dtype of the cache figure (default: the weights' floating-point dtype)")
    p.add_argument("--verify", action="store_true",
                   help="also check every file against the sha256 sums of the checkpoint's manifest.json (training "
                        "checkpoints carry one); reads every byte")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return p


def _flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} FLOP"


def _read_json(path: Path) -> dict:
    """The JSON object in ``path``; ``{}`` for a file that is missing, unreadable or holds no object."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _remote_code(d: Path, refs) -> tuple:
    """``(complete, missing)``: whether the code ``auto_map``'s AutoConfig / AutoModelForCausalLM
    entries name is there with every file it imports relatively (what transformers copies and
    loads), and the names of the files that are not (a missing one was a transformers
    ``FileNotFoundError`` at load, after this said "yes")."""
    from transformers.dynamic_module_utils import get_relative_imports

    if not all(isinstance(ref, str) for ref in refs):
        return False, []
    todo, seen, missing = [f"{ref.split('.')[0]}.py" for ref in refs], set(), []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if not (d / name).is_file():
            missing.append(name)
            continue
        todo.extend(f"{m}.py" for m in get_relative_imports(d / name))
    return not missing, sorted(missing)


def describe(path, *, max_seq_len=None, batch_size: int = 1, dtype=None, verify: bool = False,
             progress: bool = False) -> dict:
    """The report of ``orthros info`` as a dict (``ValueError`` for a directory that is not a
    complete Orthros checkpoint)."""
    from .checkpoint_files import DTYPE_BYTES, PT_WEIGHTS, checkpoint_dir, has_tokenizer, weight_headers
    from .layout import MANIFEST, TRAINER_STATE

    # the directory and its files first, before torch and transformers load (seconds): a wrong PATH is
    # refused at once
    d = checkpoint_dir(path, arg="PATH")  # (a GGUF of an architecture convert does not take: named as such)
    headers = weight_headers(d)
    if not headers:
        if any((d / f).is_file() for f in PT_WEIGHTS):
            # (generate / eval load them: from_pretrained reads .bin; info reads safetensors headers, no weights)
            raise ValueError(f"PATH {path}: its weights are pytorch_model.bin, which info cannot read without "
                             f"loading them (it reads safetensors headers); re-save the model with "
                             f"save_pretrained (safetensors) to inspect it")
        raise ValueError(f"PATH {path}: no weights (neither model.safetensors nor model.safetensors.index.json); "
                         f"not a complete checkpoint")
    manifest = d / MANIFEST
    # a training checkpoint (its TRAINER_STATE) whose manifest is gone: a save cut short or a damaged copy, which a
    # resume refuses; described, but not as a sound one
    torn = not manifest.is_file() and (d / TRAINER_STATE).is_file()
    if verify and torn:
        raise ValueError(f"--verify: {path} is a training checkpoint without its {MANIFEST} (incomplete or "
                         f"damaged, probably a save cut short): there are no sha256 sums to check its files against")
    if verify and not manifest.is_file():
        raise ValueError(f"--verify: {path} has no {MANIFEST} (only training checkpoints carry sha256 sums)")

    import torch

    from .conversion.convert import REPORT_FILE
    from .engine.cache import StaticKVCache, linear_layers
    from .models import OrthrosConfig, OrthrosForCausalLM
    from .models.loading import check_weights_fit
    from .serving import ARCHITECTURE, CPU_DEFAULT_BLOCK_SIZE, HYBRID_ARCHITECTURE, hybrid_block_tokens, is_hybrid
    from .training.checkpoint import CheckpointError, verify as verify_manifest
    from .training.metrics import forward_flops
    from .utils import dtype_name, parse_dtype

    config = OrthrosConfig.from_pretrained(str(d), local_files_only=True)
    limit = config.max_position_embeddings
    L = limit if max_seq_len is None else max_seq_len
    if L > limit:
        raise ValueError(f"--max-seq-len {L} exceeds the model's max_position_embeddings={limit}")

    # the model config.json describes, on the meta device (no memory): its weights are the files'
    with torch.device("meta"):
        model = OrthrosForCausalLM(config)
    check_weights_fit(path, config, arg="PATH", headers=headers, model=model)
    loads = set(model.state_dict()) - ({"lm_head.weight"} if config.tie_word_embeddings else set())

    # weights, from the headers: those the model loads (a load ignores the others)
    params, nbytes, by_dtype, unused = 0, 0, Counter(), []
    for entries in headers.values():
        for name, info in entries.items():
            if name not in loads:
                unused.append(name)
                continue
            n = 1
            for s in info["shape"]:
                n *= int(s)
            params += n
            nbytes += n * DTYPE_BYTES[info["dtype"]]
            by_dtype[info["dtype"]] += n
    floats = [(n, t) for t, n in by_dtype.items() if t in _SHORT]
    weights_dtype = _SHORT[max(floats)[1]] if floats else "fp32"
    cache_dtype = parse_dtype(dtype or weights_dtype, "--dtype")

    # the engine's cache for B rows of L tokens
    cache = StaticKVCache(config.num_hidden_layers, batch_size, L, config.num_key_value_heads, config.head_dim,
                          dtype=cache_dtype, device="meta", linear=linear_layers(model))

    # FLOPs of a prefill of L tokens (logits at the last one), against the same layers with full
    # attention; the Orthros output query of the last token attends to all L keys
    mode, types = config.attention_mode, list(config.layer_types)
    full = copy.deepcopy(config)
    full.attention_mode = "full"
    full.layer_types = with_attention_mode(types, "full")
    flops = forward_flops(config, [L], 1, out_keys=L)
    flops_full = forward_flops(full, [L], 1)

    tok_cfg = _read_json(d / "tokenizer_config.json")
    auto_map = _read_json(d / "config.json").get("auto_map")
    refs = [auto_map.get(k) if isinstance(auto_map, dict) else None for k in ("AutoConfig", "AutoModelForCausalLM")]
    remote, remote_missing = _remote_code(d, refs)
    origin = {}
    report = _read_json(d / REPORT_FILE)
    if report:
        origin["converted_from"] = {k: report.get(k) for k in ("architecture", "source", "orthros_version",
                                                               "window_size")}
    if torn:
        origin["incomplete_training_checkpoint"] = True
    if manifest.is_file():
        try:  # the manifest's form and its files' sizes (no byte is read); with --verify their sha256 sums too
            m = verify_manifest(d, hashes=verify, progress=progress)  # (progress: the bytes hashed, on stderr)
        except CheckpointError as e:
            raise ValueError(str(e)) from None
        origin["training_step"] = m.get("step")
        if verify:
            origin["verified"] = len(m.get("files", {}))
    backends, vllm = _vllm_backends(config)
    # vLLM picks the model class by config.json's `architectures` (a training checkpoint written before 2026-12-06
    # names none, an older hybrid OrthrosForCausalLM): without the right one first, `vllm serve PATH` stops
    architecture = HYBRID_ARCHITECTURE if is_hybrid(config) else ARCHITECTURE
    named = _read_json(d / "config.json").get("architectures")
    named_first = named[0] if isinstance(named, list) and named else None
    return {
        "path": str(d),
        "kind": model_kind(types, mode),
        "attention_mode": mode,
        "window_size": window_of(types, mode, config.window_size),
        "layers": dict(Counter(types)),
        "layer_types": types,
        "hidden_size": config.hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": bool(config.tie_word_embeddings),
        "gdn": {k: getattr(config, f"linear_{k}") for k in ("num_key_heads", "num_value_heads", "key_head_dim",
                                                            "value_head_dim", "conv_kernel_dim")}
        if LINEAR_LAYER_TYPE in types else None,
        "max_position_embeddings": limit,
        "rope": dict(getattr(config, "rope_parameters", None) or {}),
        "parameters": params,
        "weight_bytes": nbytes,
        "weight_dtypes": {_SHORT.get(t, t.lower()): n for t, n in by_dtype.most_common()},
        "files": {f.name: f.stat().st_size for f in headers},
        "unused_tensors": sorted(unused),
        "tokenizer": has_tokenizer(d),
        "chat_template": bool(tok_cfg.get("chat_template")) or (d / "chat_template.jinja").is_file(),
        "remote_code": remote,
        "remote_code_missing": remote_missing,
        "vllm": {"servable": bool(backends), "backends": list(backends), "why_not": vllm,
                 "architecture": architecture,
                 "hf_overrides": None if named_first == architecture else {"architectures": [architecture]},
                 "prefix_block_tokens": hybrid_block_tokens(config, block_size=CPU_DEFAULT_BLOCK_SIZE)
                 if backends and is_hybrid(config) else None},
        "origin": origin,
        "cache": {"batch_size": batch_size, "max_seq_len": L, "dtype": dtype_name(cache_dtype),
                  "kv_bytes_per_token": cache.bytes_per_token(), "kv_bytes": cache.nbytes, "state_bytes": cache.state_nbytes},
        "prefill_flops": {"tokens": L, "attention": flops["attention"], "attention_full": flops_full["attention"],
                          "total": sum(flops.values()), "total_full": sum(flops_full.values())},
    }


def _many(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' if n != 1 else ''}"


def _fewer(baseline: float, ours: float, digits: int) -> str:
    """``4.0x fewer``, or where the output query costs more than the window saves (a prefill of a
    few tokens) ``2.0x more``."""
    return f"{baseline / ours:.{digits}f}x fewer" if ours <= baseline else f"{ours / baseline:.{digits}f}x more"


def _never_hits(r: dict) -> str:
    """What a hybrid's prefix-cache block longer than its positions means, for the vLLM row."""
    limit = r["max_position_embeddings"]
    return (f", more than its {limit:,} positions: no prompt is ever reused"
            if r["vllm"]["prefix_block_tokens"] > limit else "")


def format_report(r: dict) -> str:
    """The table ``orthros info`` prints."""
    from .layout import MANIFEST, TRAINER_STATE

    out = [f"{r['path']}: {r['kind']} checkpoint"]

    def row(name, text):
        out.append(f"  {name:<12} {text}")

    counts = r["layers"]
    window = f", window {r['window_size']}" if r["window_size"] else ""
    row("model", f"{r['kind']}{window}: {describe_layers(r['layer_types'])}")
    tied = ", tied embeddings" if r["tie_word_embeddings"] else ""
    attention = any(t in ATTENTION_LAYER_TYPES for t in counts)
    heads = (f"{r['num_attention_heads']} query / {r['num_key_value_heads']} KV heads of {r['head_dim']}, "
             if attention else "")
    row("shape", f"hidden {r['hidden_size']:,}, {heads}MLP {r['intermediate_size']:,}, vocab {r['vocab_size']:,}{tied}")
    g = r["gdn"]
    if g:
        row("GDN", f"{g['num_key_heads']} key / {g['num_value_heads']} value heads of {g['key_head_dim']} / "
                   f"{g['value_head_dim']}, convolution of {g['conv_kernel_dim']}")
    rope = r["rope"]
    rope_text = f" (RoPE {rope.get('rope_type', 'default')}, theta {rope['rope_theta']:,g})" \
        if "rope_theta" in rope else ""
    row("positions", f"up to {r['max_position_embeddings']:,}{rope_text}")
    dtypes = ", ".join(r["weight_dtypes"])
    nfiles = len(r["files"])
    row("weights", f"{r['parameters']:,} parameters ({dtypes}), {format_bytes(r['weight_bytes'])} in {nfiles} "
                   f"file{'s' if nfiles != 1 else ''}; every header matches its file's size")
    if r["unused_tensors"]:
        names = r["unused_tensors"]
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        row("", f"and {_many(len(names), 'stored tensor')} the model does not load ({', '.join(names[:3])}{more})")
    if not r["tokenizer"]:
        tok = "none (orthros generate needs --tokenizer DIR)"
    else:
        tok = "yes, with a chat template" if r["chat_template"] else "yes (no chat template: no --chat)"
    row("tokenizer", tok)
    row("remote code", "yes: loads with trust_remote_code=True where orthros is not installed" if r["remote_code"]
        else f"no{': ' + ', '.join(r['remote_code_missing']) + ' missing' if r.get('remote_code_missing') else ''} "
             f"(loads where orthros is installed and imported)")
    v = r["vllm"]
    gpu_only = v["servable"] and "cpu" not in v["backends"]
    overrides = (f" --hf-overrides {shlex.quote(json.dumps(v['hf_overrides']))} (its config.json names "
                 f"another architecture or none; " if v["hf_overrides"] else " (")
    # vLLM reads the tokenizer from the model folder unless told otherwise: without one there it stops
    no_tok = "" if r["tokenizer"] else " --tokenizer DIR"
    overrides += ("" if r["tokenizer"] else "no tokenizer here: name a tokenizer folder, or pass "
                  "--skip-tokenizer-init instead and send token ids; ")
    row("vLLM", (f"vllm serve {shlex.quote(r['path'])}{no_tok}{overrides}with orthros[vllm] installed: "
                 f"docs/serving.md)" +
                 (f"; as {v['architecture']} (CPU backend only, so far; prefix caching reuses whole blocks of "
                  f"{v['prefix_block_tokens']:,} tokens at vLLM's default --block-size{_never_hits(r)})" if v["prefix_block_tokens"] else "") +
                 (f", on a GPU only (FLASH_ATTN or TRITON_ATTN; not yet run on one): "
                  f"{v['why_not']}" if gpu_only else ""))
        if v["servable"] else f"no: {v['why_not'].removeprefix('the vLLM Orthros model ')}; orthros generate runs it")
    origin = r["origin"]
    if "converted_from" in origin:
        c = origin["converted_from"]
        row("origin", f"converted from {c['architecture']} ({c['source']}) by orthros {c['orthros_version']}")
    if "training_step" in origin:
        check = (f"all {origin['verified']} files match its sha256 sums" if "verified" in origin
                 else "--verify checks its sha256 sums")
        row("origin", f"training checkpoint of step {origin['training_step']} ({MANIFEST}: {check})")
    if origin.get("incomplete_training_checkpoint"):
        row("origin", f"a training checkpoint ({TRAINER_STATE}) without its {MANIFEST}: incomplete or damaged, "
                      f"probably a save cut short; its files are unchecked and --resume refuses it")
    c = r["cache"]
    rows = _many(c["batch_size"], "row")
    states = f"GDN states {format_bytes(c['state_bytes'])}"
    if attention:
        peer = "the Linear Hybrid" if r["gdn"] else "a Transformer"
        same = f", as for {peer} of this shape (output tokens write none)" if r["attention_mode"] == "orthros" else ""
        row("cache", f"K/V {format_bytes(c['kv_bytes_per_token'])} a token ({c['dtype']}){same}")
        row("", f"{rows} x {_many(c['max_seq_len'], 'token')}: {format_bytes(c['kv_bytes'])}" +
            (f" + {states}" if c["state_bytes"] else ""))
    else:
        row("cache", f"no K/V (Gated DeltaNet layers only): {rows}, {states} ({c['dtype']}) at any length")
    f = r["prefill_flops"]
    if r["attention_mode"] != "full" and f["attention"]:
        baseline = "the same layers with full attention" if r["gdn"] else "a Transformer's"
        row("prefill", f"FLOPs at {_many(f['tokens'], 'token')}, against {baseline}: attention "
                       f"{_flops(f['attention'])} vs {_flops(f['attention_full'])} "
                       f"({_fewer(f['attention_full'], f['attention'], 1)})")
        row("", f"whole forward {_flops(f['total'])} vs {_flops(f['total_full'])} "
                f"({_fewer(f['total_full'], f['total'], 2)}; projections and MLPs are the same)")
    elif f["attention"]:
        row("prefill", f"FLOPs at {_many(f['tokens'], 'token')}: attention {_flops(f['attention'])}, whole forward "
                       f"{_flops(f['total'])}")
    else:
        row("prefill", f"FLOPs at {_many(f['tokens'], 'token')}: whole forward {_flops(f['total'])} "
                       f"(no attention layers)")
    return "\n".join(out)


def main(argv=None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        check_positive_int("--batch-size", args.batch_size)
        if args.max_seq_len is not None:  # omitted: the model's max_position_embeddings
            check_positive_int("--max-seq-len", args.max_seq_len)
        r = describe(args.path, max_seq_len=args.max_seq_len, batch_size=args.batch_size, dtype=args.dtype,
                     verify=args.verify, progress=True)
    except (ValueError, FileNotFoundError) as e:
        print(f"orthros info: error: {e}", file=sys.stderr)
        return 2
    print(to_json(r, indent=2) if args.json else format_report(r))
    return 0


__all__ = ["describe", "format_report", "main"]


if __name__ == "__main__":
    sys.exit(main())
