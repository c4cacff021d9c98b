"""``orthros eval mqar | niah | niah-train | lm``."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..kinds import mode_option
from ..utils import DTYPE_CHOICES, install_hint, stop_on_sigterm
from .common import TYPED, typed

CONVERT_WINDOW = 128  # --window of niah / lm / ppl: a Transformer checkpoint converted on the fly


def _conversion_window(a) -> int:
    """``--window`` of ``niah`` / ``lm`` / ``ppl``: the base stream window of a Llama / Qwen2 / Qwen3 /
    Mistral ``--model`` converted on the fly. An Orthros checkpoint keeps the window it was built with,
    so an explicit ``--window`` for one is refused rather than ignored."""
    from .common import read_config, read_max_positions, read_model_type

    cfg = read_config(a.model)
    if read_model_type(a.model, cfg) == "orthros":
        if a.window is None:
            return CONVERT_WINDOW
        raise ValueError(f"--window applies to a Llama / Qwen2 / Qwen3 / Mistral / Qwen3.5 checkpoint converted on the fly; "
                         f"--model {a.model} is an Orthros checkpoint, which keeps its own window "
                         f"({cfg.get('window_size')}); drop --window")
    window = CONVERT_WINDOW if a.window is None else a.window
    if window < 1:
        raise ValueError(f"--window must be >= 1, got {window}")
    max_pos = read_max_positions(a.model)
    if max_pos is not None and window > max_pos:  # the conversion refuses it, naming window_size, not the option
        raise ValueError(f"--window {window}{' (the default)' if a.window is None else ''} exceeds the "
                         f"max_position_embeddings ({max_pos}) of --model {a.model}: the window would hold every "
                         f"position (no sliding window); give --window <= {max_pos}")
    return window


def _check_tokenizer(a) -> None:
    """The folder ``niah`` / ``lm`` / ``ppl`` read the tokenizer from (``--tokenizer DIR``, else ``--model``'s)
    is one and holds a tokenizer file, checked as ``orthros generate`` checks it (``check_tokenizer_dir``,
    standard library only): refused before torch and transformers load (6 s), not by ``load_tokenizer``."""
    from ..checkpoint_files import check_tokenizer_dir

    check_tokenizer_dir(a.tokenizer or a.model, arg="--tokenizer" if a.tokenizer else "--model")


def _add_conversion_window(p) -> None:
    """The ``--window`` option of ``niah`` / ``lm`` / ``ppl``, read by :func:`_conversion_window`."""
    p.add_argument("--window", type=int, default=None,
                   help=f"base stream window of a Llama/Qwen2/Qwen3/Mistral/Qwen3.5 checkpoint converted on the fly "
                        f"(default: {CONVERT_WINDOW}; refused for an Orthros checkpoint, which keeps its own)")


def _mqar_parser(sub):
    p = sub.add_parser("mqar", help="train and evaluate Orthros / Transformer / SWA on multi-query associative recall",
                       description="Multi-query associative recall (Zoology-style). Trains each model with the same "
                                   "budget (steps, batch, lr, size, data) and prints an accuracy table.")
    g = p.add_argument_group("task")
    g.add_argument("--vocab-size", type=int, default=64, help="token 0 is filler; half the rest keys, half values (default: 64)")
    g.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (default: 64)")
    g.add_argument("--num-pairs", type=int, default=4, help="key-value pairs per sequence, each queried once (default: 4)")
    g.add_argument("--power", type=float, default=1.0, help="P(gap) ~ gap^-power between a key and its query (default: 1)")
    g.add_argument("--min-gap", type=int, default=1,
                   help="shortest distance in tokens from a key to its query (default: 1)")
    g.add_argument("--max-gap", type=int, default=None,
                   help="longest distance from a key to its query (default: as the sequence allows)")
    g.add_argument("--fill", choices=("pad", "noise"), default="pad",
                   help="what fills the positions between pairs and queries: pad (token 0) or noise (random tokens) "
                        "(default: pad)")
    g = p.add_argument_group("models and training (identical for every model)")
    g.add_argument("--models", default="orthros,transformer,swa",
                   help="comma list of orthros, transformer, swa, orthros-h, linear-hybrid, gdn (orthros-h, "
                        "linear-hybrid: GDN layers with attention every 4th layer, use --layers >= 4; gdn: GDN "
                        "layers only; default: orthros,transformer,swa)")
    g.add_argument("--hidden-size", type=int, default=64, help="model width of every model (default: 64)")
    g.add_argument("--layers", type=int, default=2, help="decoder layers of every model (default: 2)")
    g.add_argument("--heads", type=int, default=2, help="attention heads of every model (default: 2)")
    g.add_argument("--linear-heads", type=int, default=None,
                   help="heads of the GDN layers of orthros-h, linear-hybrid, gdn (their state is heads x "
                        "(d/heads)^2); default --heads")
    g.add_argument("--window", type=int, default=8, help="window of Orthros's base stream and of SWA (default: 8)")
    g.add_argument("--steps", type=int, default=800, help="training steps of every model (default: 800)")
    g.add_argument("--batch-size", type=int, default=32, help="sequences per training step (default: 32)")
    g.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: 3e-3)")
    g.add_argument("--eval-examples", type=int, default=1000,
                   help="held-out sequences scored after training (default: 1000)")
    g.add_argument("--seed", type=int, default=0, help="seed of every random draw (default: 0)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default or 0: torch's own choice)")
    g.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    g.add_argument("--compile", action="store_true",
                   help="train each model's decoder layers through torch.compile (static shapes; the same "
                        "optimiser, schedule, data and seeds as eager; compilation takes seconds to a minute "
                        "per model, then each step launches far fewer kernels: for long GPU runs)")
    g.add_argument("--jobs", type=int, default=1,
                   help="train up to this many models at once, one process each (same data from the same seeds; "
                        "on a GPU the small, launch-bound models share the device: wall time ~ the slowest model's; "
                        "default: 1)")
    p.add_argument("--output", "-o", default=None, action=spelled(), help="write the results as JSON here")
    p.add_argument("--plot", default=None, metavar="PNG", help="draw accuracy against the key-to-query distance here")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")


def _add_model_argument(p):
    p.add_argument("--model", required=True, help="Orthros checkpoint dir (or a Llama/Qwen2/Qwen3/Mistral/Qwen3.5 one: "
                                                  "converted on the fly with --window)")


def _niah_parser(sub):
    p = sub.add_parser("niah", help="needle-in-a-haystack grid (context length x depth) on a checkpoint",
                       description="Hide a number at each depth of a haystack of each length; greedy answer; exact "
                                   "string match. Writes JSON and a heatmap PNG.")
    _add_model_argument(p)
    p.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the model dir)")
    p.add_argument("--lengths", default="256,512,1024", help="context lengths in tokens, comma list (default: 256,512,1024)")
    p.add_argument("--depths", default="0,25,50,75,100", help="needle depths in percent (integers 0..100), comma list (default: 0,25,50,75,100)")
    p.add_argument("--samples", type=int, default=2, help="needles per cell (default: 2)")
    p.add_argument("--haystack", default="synthetic", help="synthetic | corpus | PATH.txt | PATH.jsonl (default: synthetic)")
    p.add_argument("--digits", type=int, default=7, help="digits of the hidden number (default: 7)")
    _add_conversion_window(p)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default=None, choices=DTYPE_CHOICES, help="weights' dtype (default: as stored)")
    p.add_argument("--engine", default="auto", choices=("auto", "on", "off"),
                   help="fast engine: on, off, or auto (the default): on CUDA; otherwise transformers' generate")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default: 0)")
    p.add_argument("--output-dir", "-o", default="niah_results", action=spelled(),
                   help="folder for the results JSON and the heatmap PNG (default: niah_results)")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")


def _niah_train_parser(sub):
    from .niah_train import add_arguments

    p = sub.add_parser("niah-train", help="train a small model on passkey retrieval in the `eval niah` format",
                       description="Generates passkey-retrieval data in exactly the prompt format `orthros eval niah` "
                                   "scores (labels on the answer only), trains a small model and saves it "
                                   "(with the tokenizer) to --out for `orthros eval niah --model OUT`.")
    add_arguments(p)


def spelled(action: type = argparse._StoreAction) -> type:
    """``action`` (an argparse action class) that also records the spelling typed (``--batch_size`` or
    ``--batch-size``, ``-o`` or ``--output``) under :data:`TYPED`, for errors that name the option as the
    user typed it (:func:`~orthros.evaluation.common.typed`)."""

    class Spelled(action):
        def __call__(self, parser, namespace, values, option_string=None):
            setattr(namespace, TYPED, {**(getattr(namespace, TYPED, None) or {}), self.dest: option_string})
            super().__call__(parser, namespace, values, option_string)

    return Spelled


def _lm_parser(sub):
    p = sub.add_parser("lm", help="lm-evaluation-harness tasks on a checkpoint",
                       description=f"Runs lm-evaluation-harness with Orthros registered; install it with {install_hint('eval')}. The "
                                   "shipped offline task `orthros_tiny_cloze` is always available.")
    p.add_argument("--model", required=True,
                   help="Orthros checkpoint dir (or a Llama/Qwen2/Qwen3/Mistral/Qwen3.5 one: converted on the fly with "
                        "--window)")
    p.add_argument("--tasks", required=True, help="comma list of lm-eval task names")
    p.add_argument("--include_path", "--include-path", dest="include_path", action=spelled(argparse._AppendAction),
                   default=None, help="extra folder of task YAMLs (repeatable)")
    p.add_argument("--limit", type=float, default=None,
                   help="examples per task (an integer), or a fraction of each task's examples (below 1)")
    p.add_argument("--num_fewshot", "--num-fewshot", dest="num_fewshot", type=int, default=None,
                   action=spelled(),
                   help="few-shot examples per prompt (default: the task's own)")
    p.add_argument("--batch_size", "--batch-size", dest="batch_size", type=int, default=1,
                   action=spelled(),
                   help="sequences per forward (default: 1)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default=None, choices=DTYPE_CHOICES, help="weights' dtype (default: as stored)")
    p.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the model dir)")
    _add_conversion_window(p)
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default: 0)")
    p.add_argument("--output", "-o", default=None, action=spelled(), help="write the results as JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")


PPL_SEQ_LEN = 8192  # eval ppl's --seq-len, unless the model has fewer positions


def _ppl_parser(sub):
    p = sub.add_parser("ppl", help="perplexity on held-out text by token position (0-128, 128-512, 512-2K, 2K-8K)",
                       description="Perplexity of a checkpoint on windows of --seq-len tokens of held-out "
                                   "documents, per bucket of token positions (orthros/evaluation/perplexity.py).")
    _add_model_argument(p)
    p.add_argument("--data", required=True, help="held-out text: a .jsonl (field 'text', one document per line) "
                                                 "or a .txt")
    p.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the model dir)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="tokens per scored window (default: 8192, or the model's max_position_embeddings if fewer)")
    p.add_argument("--windows", type=int, default=16, help="at most this many windows (default 16)")
    p.add_argument("--buckets", default=None,
                   help="bucket edges in positions, comma list (default: 0,128,512,2048,8192, those below a "
                        "shorter --seq-len then --seq-len)")
    p.add_argument("--attention-mode", default=None, type=mode_option, metavar="{orthros,full,window}",
                   help="override the checkpoint's attention (full or transformer: the same weights as a "
                        "Transformer; window or swa; default: the checkpoint's)")
    _add_conversion_window(p)
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default=None, choices=DTYPE_CHOICES, help="weights' dtype (default: as stored)")
    p.add_argument("--output", "-o", default=None, action=spelled(), help="write the results as JSON here")
    p.add_argument("--plot", default=None, metavar="PNG", help="draw perplexity against token position here")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")


def _ppl(a) -> int:
    from ..utils import check_device, check_output_path, check_png, dtype_name, write_json, written_together
    from .common import (check_attention_mode, check_distinct_files, check_token_range, default_device, load_model,
                         load_tokenizer, parse_int_list, read_config, read_max_positions, tokenizer_name)
    from .perplexity import (check_buckets, default_buckets, format_table, load_documents, make_windows,
                             plot_position_perplexity, position_perplexity)

    if a.seq_len is not None and a.seq_len < 2:
        raise ValueError(f"--seq-len must be >= 2, got {a.seq_len}")
    if a.windows < 1:
        raise ValueError(f"--windows must be >= 1, got {a.windows}")
    output = typed(a, "output")  # -o or --output, as typed
    if a.plot is not None:
        check_png("--plot", a.plot)  # check_output_path of a .png
    if a.output:
        check_output_path(output, a.output)
    check_distinct_files([(output, a.output), ("--plot", a.plot)], [("--data", a.data)],
                         [("--model", a.model), ("--tokenizer", a.tokenizer)])
    max_pos = read_max_positions(a.model)  # (and a clear error when --model is not a checkpoint)
    if a.seq_len is None:
        a.seq_len = min(PPL_SEQ_LEN, max_pos) if max_pos is not None else PPL_SEQ_LEN
    edges = check_buckets(default_buckets(a.seq_len) if a.buckets is None else parse_int_list(a.buckets, "--buckets"),
                          a.seq_len)
    docs = load_documents(a.data)
    check_attention_mode(a.model, a.attention_mode)
    window = _conversion_window(a)
    _check_tokenizer(a)
    device = check_device(a.device) if a.device else default_device()  # (after what needs no torch)
    if max_pos is not None and a.seq_len > max_pos:
        raise ValueError(f"--seq-len {a.seq_len} is above the model's max_position_embeddings ({max_pos})")
    tok = load_tokenizer(a.model, a.tokenizer)
    windows = make_windows(tok, docs, a.seq_len, a.windows)
    check_token_range(max(map(max, windows)), read_config(a.model).get("vocab_size"),
                      tokenizer_name(a.model, a.tokenizer))
    model = load_model(a.model, device=device, dtype=a.dtype, window_size=window, attention_mode=a.attention_mode)
    if a.seq_len > model.config.max_position_embeddings:
        raise ValueError(f"--seq-len {a.seq_len} is above the model's max_position_embeddings "
                         f"({model.config.max_position_embeddings})")
    out = position_perplexity(model, windows, buckets=edges, progress=not a.no_progress)
    out["model"] = str(a.model)
    out["attention_mode"] = model.config.attention_mode
    # what the figures depend on besides the weights: the window (a converted model's is --window), the text
    # scored and its tokenizer, the device and dtype (as `eval niah` records them)
    param = next(model.parameters())
    out.update(window_size=getattr(model.config, "window_size", None), data=str(a.data),
               tokenizer=str(a.tokenizer or a.model), device=str(param.device), dtype=dtype_name(param.dtype))
    name = Path(a.model).resolve().name + (f" ({a.attention_mode})" if a.attention_mode else "")
    print(format_table({name: out}))
    with written_together():  # both files or neither
        if a.output:
            write_json(a.output, out, name=output)
        if a.plot:
            plot_position_perplexity({name: out}, a.plot, name="--plot")
    for f in (a.output, a.plot):
        if f:
            print(f"wrote {f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orthros eval", description="Evaluations of Orthros models.")
    sub = p.add_subparsers(dest="what", metavar="{mqar,niah,niah-train,lm,ppl}")
    _mqar_parser(sub)
    _niah_parser(sub)
    _niah_train_parser(sub)
    _lm_parser(sub)
    _ppl_parser(sub)
    for sp in sub.choices.values():  # each sub-command names itself in its errors (see main)
        sp.set_defaults(sub_parser=sp)
    return p


# the MQARTask fields and the `eval mqar` options that set them: the task's errors name the option typed
MQAR_TASK_OPTIONS = {"vocab_size": "--vocab-size", "seq_len": "--seq-len", "num_pairs": "--num-pairs",
                     "power": "--power", "min_gap": "--min-gap", "max_gap": "--max-gap", "fill": "--fill"}
# the MQARTrain fields (and run_mqar's jobs) and the options that set them
MQAR_TRAIN_OPTIONS = {"models": "--models", "hidden_size": "--hidden-size", "num_layers": "--layers",
                      "num_heads": "--heads", "linear_heads": "--linear-heads", "window_size": "--window",
                      "steps": "--steps", "batch_size": "--batch-size", "lr": "--lr", "eval_examples": "--eval-examples",
                      "seed": "--seed", "threads": "--threads", "device": "--device", "compile": "--compile",
                      "jobs": "--jobs"}


def _mqar(a) -> int:
    from ..kinds import HYBRID_DISPLAY
    from ..utils import check_device, check_output_path, check_png, write_json, written_together
    from .common import check_distinct_files, check_seed

    models = tuple(m.strip().lower() for m in a.models.split(",") if m.strip())
    for name in ("steps", "batch_size", "hidden_size", "layers", "heads", "window", "eval_examples", "jobs"):
        if getattr(a, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not (math.isfinite(a.lr) and a.lr > 0):
        raise ValueError(f"--lr must be a finite number > 0, got {a.lr}")
    check_seed(a.seed)
    if a.threads is not None and a.threads < 0:
        raise ValueError(f"--threads must be >= 0 (0: torch's own choice), got {a.threads}")
    device = check_device(a.device)  # (a misspelt one before torch loads; a valid one imports it)
    from .mqar import (MODEL_ALIASES, MQARTask, MQARTrain, check_models, check_run, format_table, plot_recall,
                       run_mqar)  # (torch: after the checks above, which need none)

    check_models(models, a.layers, "--models", "--layers")
    output = typed(a, "output")  # -o or --output, as typed
    if a.plot is not None:
        check_png("--plot", a.plot)  # check_output_path of a .png
    if a.output:
        check_output_path(output, a.output)
    check_distinct_files([(output, a.output), ("--plot", a.plot)])
    if a.linear_heads is not None and (a.linear_heads < 1 or a.hidden_size % a.linear_heads):
        raise ValueError(f"--linear-heads must be >= 1 and divide --hidden-size ({a.hidden_size}), got {a.linear_heads}")
    if a.linear_heads is not None and not any(MODEL_ALIASES[m] in HYBRID_DISPLAY for m in models):
        raise ValueError(f"--linear-heads {a.linear_heads} sets the heads of the GDN layers of "
                         f"{', '.join(HYBRID_DISPLAY)}; --models {','.join(models)} has none")
    task = MQARTask(vocab_size=a.vocab_size, seq_len=a.seq_len, num_pairs=a.num_pairs, power=a.power,
                    min_gap=a.min_gap, max_gap=a.max_gap, fill=a.fill).validate(names=MQAR_TASK_OPTIONS)
    tr = MQARTrain(models=models, hidden_size=a.hidden_size, num_layers=a.layers, num_heads=a.heads,
                   linear_heads=a.linear_heads, window_size=a.window, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
                   eval_examples=a.eval_examples, seed=a.seed, threads=a.threads, device=device,
                   compile=a.compile)
    if a.hidden_size % a.heads:
        raise ValueError(f"--hidden-size ({a.hidden_size}) must be a multiple of --heads ({a.heads})")
    check_run(task, tr, a.jobs, names={**MQAR_TASK_OPTIONS, **MQAR_TRAIN_OPTIONS})  # and that it fits in memory
    print(f"MQAR: vocab {task.vocab_size}, seq {task.seq_len}, {task.num_pairs} pairs, gaps ~ gap^-{task.power:g} "
          f"in [{task.min_gap}, {min(task.max_gap or task.seq_len, task.seq_len - 2)}], window {tr.window_size}; {tr.num_layers} layers, "
          f"d={tr.hidden_size}, {tr.steps} steps x {tr.batch_size} on {tr.device}{', compiled' if tr.compile else ''}"
          + (f", {min(a.jobs, len(models))} models at once" if a.jobs > 1 and len(models) > 1 else ""))
    out = run_mqar(task, tr, progress=not a.no_progress, jobs=a.jobs)
    print()
    print(format_table(out))
    with written_together():  # both files or neither
        if a.output:
            write_json(a.output, out, name=output)
        if a.plot:
            plot_recall(out, a.plot, name="--plot")
    if a.output or a.plot:
        print()
    for f in (a.output, a.plot):
        if f:
            print(f"wrote {f}")
    return 0


def _niah(a) -> int:
    from ..utils import check_device, check_output_path, write_json, written_together
    from .common import (check_token_range, default_device, load_model, load_tokenizer, parse_int_list, read_config,
                         read_max_positions, tokenizer_name)
    from .niah import (NIAHConfig, PromptBuilder, check_lengths, format_grid, haystack_sentences, run_niah,
                       save_heatmap, validate)

    cfg = NIAHConfig(lengths=parse_int_list(a.lengths, "--lengths"), depths=parse_int_list(a.depths, "--depths"),
                     samples=a.samples, haystack=a.haystack, digits=a.digits, seed=a.seed, engine=a.engine)
    validate(cfg)  # everything that needs no model, before loading it
    output_dir = typed(a, "output_dir")  # -o or --output-dir, as typed
    check_output_path(output_dir, a.output_dir, directory=True)
    max_pos = read_max_positions(a.model)  # (the model's folder and config.json before torch loads for the device)
    validate(cfg, max_pos)
    window = _conversion_window(a)
    _check_tokenizer(a)
    device = check_device(a.device) if a.device else default_device()
    haystack_sentences(cfg.haystack)  # readable, with text in it
    tok = load_tokenizer(a.model, a.tokenizer)
    check_lengths(cfg, tok, max_pos)
    builder, tok_name = PromptBuilder(tok, cfg.haystack, seed=cfg.seed), tokenizer_name(a.model, a.tokenizer)
    check_token_range(builder.max_id, read_config(a.model).get("vocab_size"), tok_name)
    model = load_model(a.model, device=device, dtype=a.dtype, window_size=window)
    validate(cfg, model.config.max_position_embeddings)
    out = run_niah(model, tok, cfg, progress=not a.no_progress, tokenizer_name=tok_name, builder=builder)
    out["model"]["path"] = str(a.model)
    d = Path(a.output_dir)
    with written_together():  # both files or neither (nor a folder made for them)
        write_json(d / "niah.json", out, name=output_dir)
        save_heatmap(out, d / "niah.png", title=f"NIAH {Path(a.model).resolve().name}: {100 * out['accuracy']:.1f}%",
                     name=output_dir)
    print(format_grid(out))
    print(f"\noverall accuracy {100 * out['accuracy']:.1f}%  ({out['seconds']:.0f}s)\nwrote {d / 'niah.json'} and "
          f"{d / 'niah.png'}")
    return 0


def _niah_train(a) -> int:
    from .niah_train import run_cli

    return run_cli(a)


def _lm(a) -> int:
    from ..utils import check_device, check_output_path, write_json
    from .common import check_distinct_files, default_device
    from .lm import check_include_paths, run_lm_eval, summary

    limit = a.limit
    if limit is not None and not (0 < limit < 1 or (limit >= 1 and float(limit).is_integer())):
        raise ValueError(f"--limit must be an integer >= 1 or a fraction in (0, 1), got {limit:g}")
    if limit is not None and limit >= 1:
        limit = int(limit)
    if a.batch_size < 1:
        raise ValueError(f"{typed(a, 'batch_size')} must be >= 1, got {a.batch_size}")
    if a.num_fewshot is not None and a.num_fewshot < 0:
        raise ValueError(f"{typed(a, 'num_fewshot')} must be >= 0, got {a.num_fewshot}")
    check_include_paths(a.include_path or [], typed(a, "include_path"))
    if not 0 <= a.seed < 2 ** 32:  # lm-eval seeds numpy's legacy generator with it
        raise ValueError(f"--seed must be in 0..{2 ** 32 - 1}, got {a.seed}")
    window = _conversion_window(a)
    _check_tokenizer(a)
    device = check_device(a.device) if a.device else default_device()  # (after what needs no torch)
    output = typed(a, "output")  # -o or --output, as typed
    if a.output:
        check_output_path(output, a.output)
        check_distinct_files([(output, a.output)], checkpoints=[("--model", a.model), ("--tokenizer", a.tokenizer)])
    res = run_lm_eval(a.model, a.tasks.split(","), include_path=a.include_path, limit=limit,
                      batch_size=a.batch_size, device=device, dtype=a.dtype,
                      num_fewshot=a.num_fewshot, window_size=window, tokenizer=a.tokenizer, seed=a.seed,
                      progress=not a.no_progress)
    from lm_eval.utils import make_table

    print(make_table(res))
    if a.output:
        write_json(a.output, summary(res), name=output)
        print(f"wrote {a.output}")
    return 0


@stop_on_sigterm("orthros eval")  # a SIGTERM (a scheduler, kill): one line, exit 143, no temporary file left
def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    a, extra = parser.parse_known_args(argv)
    if extra:  # named by the sub-command they were given to (argparse names only `orthros eval`)
        getattr(a, "sub_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if a.what is None:
        parser.print_help()
        return 0
    try:
        from .common import check_no_empty_values

        check_no_empty_values(a.sub_parser, a)
        return {"mqar": _mqar, "niah": _niah, "niah-train": _niah_train, "lm": _lm, "ppl": _ppl}[a.what](a)
    except ValueError as e:
        print(f"orthros eval {a.what}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
