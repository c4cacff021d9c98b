"""``orthros generate``: stream text from an Orthros checkpoint through the inference engine.

    orthros generate --model PATH "Once upon a time"
    orthros generate --model PATH --chat --interactive        # multi-turn, the cache is kept
    orthros generate --model PATH --chat --system "Be brief." "Why is the sky blue?"
    orthros generate --model PATH --prompts FILE -o out.jsonl  # a file of prompts, in batches

In ``--interactive`` mode every line read from stdin is a new user turn appended to the same
cache: only the new tokens run (the old context is never recomputed). At a terminal, ``> `` on
stderr prompts for each turn; end with Ctrl-D (or Ctrl-C at the prompt). Ctrl-C while a reply
streams stops that reply and returns to the prompt: the reply so far stays in the conversation, as
a reply cut by --max-new-tokens does (stopped before its first token, the turn is dropped).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..utils import (DTYPE_ALIASES as DTYPES, check_device, check_input_file, check_output_path, expand_path,
                     isatty, parse_dtype, read_text_file, same_file, show_traceback, stop_on_sigterm)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orthros generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompt", nargs="*",
                   help="prompt text (default: read stdin, less its trailing newlines, as the shell's $(...) drops them)")
    p.add_argument("--model", required=True, help="directory of an Orthros checkpoint (save_pretrained)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: --model)")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="tokens to generate per turn (default: 256; fewer at an end-of-sequence token)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off (with --temperature > 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="1 = off (with --temperature > 0)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the sampler (default: none; greedy decoding needs none). With --prompts one "
                        "generator serves a batch: a prompt's text depends on its batch too (--batch-size, order); "
                        "each batch (each --interactive turn) draws from its own seed, derived from this one")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, fp32 on cpu), bf16, fp16, fp32")
    p.add_argument("--max-seq-len", type=int, default=None,
                   help="cache slots per row, all turns (default: min(8192, the model's max_position_embeddings))")
    p.add_argument("--prefill-chunk", type=int, default=16384,
                   help="prompt tokens per prefill chunk (default: 16384; activation memory grows with it)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="decode eagerly")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the token-wise layer parts (faster steps after a one-time compile)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gemv", action="store_true",
                   help="decode through the fused weight-streaming GEMVs (Engine(gemv=True)); the default on CUDA "
                        "(measured 2-13%% faster on an H200 at B = 1-8; docs/engine.md)")
    g.add_argument("--no-gemv", action="store_true", help="decode with the projections' ops one by one")
    p.add_argument("--chat", action="store_true", help="wrap turns in the tokenizer's chat template")
    p.add_argument("--system", metavar="TEXT", default=None,
                   help="with --chat: a system message that opens the conversation (every prompt's, with --prompts)")
    p.add_argument("--interactive", action="store_true",
                   help="multi-turn: read one user turn per stdin line (Ctrl-C during a reply stops the reply, "
                        "which stays in the conversation as far as it got; Ctrl-D or Ctrl-C at the prompt ends)")
    g = p.add_argument_group("a file of prompts")
    g.add_argument("--prompts", default=None, metavar="FILE",
                   help="generate for every prompt of FILE, --batch-size at a time: a .txt (one prompt a line, "
                        "blank lines skipped) or a .jsonl (one {\"prompt\": ...} a line); one JSON line a prompt "
                        "(prompt, completion, token counts, why it stopped) to --output, in the file's order")
    g.add_argument("--batch-size", type=int, default=None,
                   help="with --prompts: prompts generated together (default: 8)")
    g.add_argument("--output", "-o", default=None, metavar="FILE",
                   help="the JSON lines of --prompts (written through a temporary name; a run stopped early writes "
                        "its finished lines to FILE.partial; default, or -: stdout, batch by batch)")
    p.add_argument("--stats", action="store_true",
                   help="after each turn, print its timings on stderr: the prompt's tokens and the time to the "
                        "first new token (prefill), then the decode rate over the tokens after it (with --prompts: "
                        "one line for the whole file)")
    return p


# the engine's length errors (RequestTooLong) in this command's option names
CLI_NAMES = {"max_seq_len": "--max-seq-len {}", "max_new_tokens": "--max-new-tokens",
             "more_slots": "raise --max-seq-len (up to the model's max_position_embeddings={max_positions})"}


def turn_stats(prompt_tokens: int, new_tokens: int, t_start: float, t_first, t_last) -> str:
    """One line of a turn's timings (seconds from ``time.perf_counter``; ``t_first`` / ``t_last``:
    when the first and the last new token arrived, None when none did)."""
    prompt = f"[stats] {prompt_tokens} prompt token{'s' if prompt_tokens != 1 else ''}"
    if t_first is None:
        return f"{prompt}, no new token"
    line = f"{prompt}, first new token after {1e3 * (t_first - t_start):.1f} ms"
    if new_tokens > 1:
        rate = (new_tokens - 1) / max(t_last - t_first, 1e-9)
        line += f"; {new_tokens} new tokens, decode {rate:.1f} tokens/s ({1e3 / rate:.2f} ms a step)"
    return line


def _check_dtype(args) -> None:
    """``--dtype``'s spelling (before torch loads)."""
    if args.dtype != "auto" and args.dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of auto, {', '.join(sorted(DTYPES))}; got {args.dtype!r}")


def _resolve(args):
    dev = check_device(args.device, auto=True)  # (a misspelt device is refused before torch loads)
    import torch

    dev = torch.device(dev)
    if args.dtype == "auto":
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    else:
        dtype = parse_dtype(args.dtype, "--dtype")
    return dev, dtype


class _TextStream:
    """Prints the text of a growing token list, only the part not printed yet; :meth:`end` ends
    the line after what is left (the text printed is then the tokens' decoded text)."""

    def __init__(self, tok, out):
        self.tok, self.out, self.ids, self.printed = tok, out, [], ""

    def push(self, t):
        self.ids.append(t)
        self._write(partial_ok=False)

    def end(self):
        """After the last token: a character cut by the end of the reply prints as U+FFFD (as the
        decoded text has it), then the line ends."""
        self._write(partial_ok=True, tail="\n")

    def _write(self, partial_ok: bool, tail: str = ""):
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not partial_ok:  # an incomplete multi-byte character: wait for more
            return
        self.out.write(text[len(self.printed):] + tail)
        self.out.flush()
        self.printed = text


@stop_on_sigterm("orthros generate")  # a SIGTERM (a scheduler, kill): one line, exit 143, no temporary file left
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .sampling import SamplingParams

    try:  # argument and checkpoint errors before loading anything
        try:
            sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                      seed=args.seed)
        except ValueError as e:  # named by its field ("top_p must be ..."): name the option instead
            field, rest = str(e).split(" ", 1)
            raise ValueError(f"--{field.replace('_', '-')} {rest}") from None
        if sampling.greedy and (args.top_k or args.top_p < 1):  # argmax is in every top-k / top-p set
            raise ValueError("--top-k and --top-p filter what is sampled, and --temperature 0 (the default) is greedy: "
                             "set --temperature > 0 to sample (1 = the model's distribution)")
        for name in ("max_new_tokens", "max_seq_len", "prefill_chunk", "batch_size"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        if args.system is not None and not args.chat:
            raise ValueError("--system goes with --chat (it is a message of the chat template)")
        if args.system is not None:
            _check_utf8(args.system, "--system")
        if args.prompt and not any(args.prompt):  # `""` (an unset shell variable): else read as no argument
            raise ValueError(f"the prompt argument is empty ({' '.join(map(repr, args.prompt))}): give the text to "
                             f"continue, or leave it out to read stdin (--interactive: one turn a line; --prompts FILE)")
        prompts = _check_prompt_file(args)
        _check_dtype(args)
        tok_dir = _check_checkpoint_files(args)  # (these need neither torch nor transformers: refused at once)
        _check_output_outside(args, tok_dir)
        dev, dtype = _resolve(args)
        config = _check_checkpoint(args)
    except ValueError as e:
        return _fail(e, 2)
    try:
        return _generate(args, sampling, dev, dtype, config, tok_dir, prompts)
    except ValueError as e:  # bad input found while loading or running (e.g. a prompt too long)
        return _fail(e, 2)
    except KeyboardInterrupt:
        print("orthros generate: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001  (a runtime failure: one line, exit 1)
        if isinstance(e, BrokenPipeError) or show_traceback():
            raise  # `orthros` handles these as for every command: a reader gone (141), the traceback shown
        return _fail(f"{type(e).__name__}: {e}", 1)


def _fail(e, code: int) -> int:
    print("orthros generate: error: " + " ".join(str(e).split()), file=sys.stderr)
    return code


def _check_prompt_file(args):
    """The prompts of ``--prompts`` (None without it) as ``(line, text)`` pairs, read and checked
    before anything loads."""
    import json

    if args.prompts is None:
        if args.output is not None:
            raise ValueError("--output goes with --prompts (a single prompt streams its text to stdout)")
        if args.batch_size is not None:
            raise ValueError("--batch-size goes with --prompts (a single prompt or --interactive runs one row)")
        return None
    if args.batch_size is None:
        args.batch_size = 8
    if args.output == "-":  # stdout, as for most tools (and as without --output), not a file named "-"
        args.output = None
    if args.prompt or args.interactive:
        raise ValueError("--prompts replaces the prompt argument and --interactive: give one of them")
    path = check_input_file("--prompts", args.prompts)
    if path.suffix.lower() not in (".txt", ".jsonl"):
        raise ValueError(f"--prompts {path}: a .txt (one prompt a line) or a .jsonl file is needed")
    if args.output is not None:  # written at the end: refused now if it cannot be
        check_output_path("--output", args.output)
        if same_file(args.output, path):  # the records would replace the prompts
            raise ValueError(f"--output {args.output} is the --prompts file: name another file for the records")
    prompts = []
    # lines end at newlines only (read_text_file's universal newlines make \r\n and \r one): str.splitlines
    # would also split at a form feed, U+0085 or U+2028 inside a prompt (raw in JSON with ensure_ascii=False)
    # and a UTF-8 byte order mark (Windows editors write one) is no part of the first prompt
    for n, line in enumerate(read_text_file(path, "--prompts").removeprefix("\ufeff").split("\n"), 1):
        if not line.strip():
            continue
        if path.suffix.lower() == ".txt":
            prompts.append((n, line))
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--prompts {path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not rec["prompt"]:
            raise ValueError(f"--prompts {path}:{n}: a JSON object with a non-empty string \"prompt\" is needed")
        _check_utf8(rec["prompt"], f"--prompts {path}:{n}: the prompt")
        prompts.append((n, rec["prompt"]))
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompt in the file")
    return prompts


def _check_checkpoint_files(args):
    """The checkpoint and tokenizer directories and their files, checked without loading torch or
    transformers: returns the tokenizer directory."""
    from ..checkpoint_files import check_tokenizer_dir, check_weights, checkpoint_dir

    d = checkpoint_dir(args.model, arg="--model")
    args.model = str(d)  # `~` expanded: the loading and generation_config.json read this directory
    check_weights(d)
    given = args.tokenizer is not None  # --tokenizer "" is refused as empty, not taken for the default
    return check_tokenizer_dir(args.tokenizer if given else d, arg="--tokenizer" if given else "--model")


def _check_output_outside(args, tok_dir) -> None:
    """Refuse an ``--output`` inside the ``--model`` or ``--tokenizer`` directory, or a symbolic link
    to one of their files (the records replace a link's target): ``-o CKPT/config.json`` replaced the
    checkpoint's config once every prompt had run, and the checkpoint no longer loaded. (A stopped
    run's ``.partial`` file would land there too; a hard link is replaced, not written through.)"""
    if args.output is None:
        return
    out = os.path.realpath(expand_path(args.output, "--output"))  # links resolved: a link into the folder is in it
    for d, opt in ((os.path.realpath(args.model), "--model"), (os.path.realpath(tok_dir), "--tokenizer")):
        if os.path.commonpath([out, d]) == d:
            raise ValueError(f"--output {args.output} is inside the {opt} directory {d}: the records would be "
                             f"written among its files; name a file outside it")


def _check_checkpoint(args):
    """The model config of the checked directory (:func:`_check_checkpoint_files`) and the cache
    size, checked without loading weights: returns the config."""
    from ..models import OrthrosConfig
    from .engine import check_max_seq_len

    config = OrthrosConfig.from_pretrained(args.model, local_files_only=True)
    limit = config.max_position_embeddings
    if args.max_seq_len is None:
        args.max_seq_len = min(8192, limit)
    check_max_seq_len(args.max_seq_len, limit, names=CLI_NAMES)  # the engine's check, before the weights load
    if args.interactive and args.max_new_tokens > args.max_seq_len:  # no turn could ever fit
        raise ValueError(f"--max-new-tokens {args.max_new_tokens} does not fit --max-seq-len {args.max_seq_len} "
                         f"(the cache slots of the whole conversation; default min(8192, the model's "
                         f"max_position_embeddings={limit})): no turn could run; lower --max-new-tokens")
    return config


def _generate(args, sampling, dev, dtype, config, tok_dir, prompts=None) -> int:
    import torch
    from transformers import AutoTokenizer

    from .engine import RequestTooLong, check_fits

    try:
        tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    except Exception as e:  # noqa: BLE001  (transformers raises many kinds here)
        raise ValueError(f"{tok_dir}: the tokenizer does not load ({type(e).__name__}: {e})") from None
    if args.chat and not getattr(tok, "chat_template", None):
        raise ValueError(f"--chat: the tokenizer in {tok_dir} has no chat template; drop --chat (and --system) "
                         f"for plain-text prompts, or give --tokenizer a directory with one")
    if prompts is not None:
        return _generate_file(args, sampling, dev, dtype, config, tok, prompts)
    messages, history = _opening(args), []

    def encode_turn(text):
        _check_utf8(text, "the prompt")
        if not args.chat:  # a later line continues the text after the reply and the line end typed (shown so too)
            return tok(text if not history else "\n" + text, add_special_tokens=not history)["input_ids"]
        messages.append({"role": "user", "content": text})
        full = _chat_ids(tok, messages)
        if full[:len(history)] == history:  # only the new tokens of the conversation
            return full[len(history):]
        return _after_reply(tok, messages, history)

    first = None  # the first turn is encoded and checked before the weights load
    if args.prompt or not args.interactive:
        # `echo PROMPT |` adds a line break the user did not mean as prompt (the model would continue after it)
        if not args.prompt and isatty(sys.stdin):  # else a terminal would wait for it without a word
            print("orthros generate: reading the prompt from stdin; end it with Ctrl-D (or give it as an argument, "
                  "or --interactive for one turn a line)", file=sys.stderr, flush=True)
        text = " ".join(args.prompt) if args.prompt else sys.stdin.read().rstrip("\r\n")
        if not text:  # (an empty argument is refused before the checkpoint is read)
            raise ValueError("the prompt read from stdin is empty: give the prompt as an argument, pipe its text in, or "
                             "use --interactive (one turn a line)")
        first = encode_turn(text)
        if not first:  # as --prompts refuses one (nothing would run, and exit 0 would say it did)
            raise ValueError("the prompt encodes to no tokens")
        _check_vocab(first, config, tok, "the prompt")
        check_fits(0, len(first), args.max_new_tokens, max_seq_len=args.max_seq_len,
                   max_positions=config.max_position_embeddings, where="the prompt", names=CLI_NAMES)

    engine, eos = _load_engine(args, config, dtype, dev, tok, max_batch_size=1)

    def run_turn(ids):
        if not ids:
            return
        out = _TextStream(tok, sys.stdout)
        new = out.ids  # the reply's tokens: one list, so a reply stopped in push() shows what it keeps
        t_start, t_first, t_last = time.perf_counter(), None, None
        # the engine holds the conversation unless a stopped turn lost it (below): then the turn runs it all again
        resume = bool(history) and engine.batch_size == 0
        try:  # the request is checked here, before any work
            steps = engine.stream([history + ids if resume else ids], args.max_new_tokens,
                                  _request_sampling(sampling, len(history)), eos_token_id=eos,
                                  continue_=bool(history) and not resume)
        except RequestTooLong as e:  # said with the options that change it, not the engine's arguments
            full = e.n_cached + e.max_new_tokens > min(e.max_seq_len, e.max_positions)  # not even 1 token fits
            if resume:  # the conversation so far, run again as a prompt: its own counts
                full = len(history) + e.max_new_tokens > min(e.max_seq_len, e.max_positions)
            raise ValueError(e.phrased(CLI_NAMES, where="this turn") + (
                " (the conversation has no room left for another turn)" if full else "")) from None
        stopped = False
        try:
            with torch.no_grad():
                for step in steps:
                    if step[0] is not None:  # a host int: the step's device work is done
                        t_last = time.perf_counter()
                        t_first = t_last if t_first is None else t_first
                        out.push(step[0])
        except KeyboardInterrupt:  # --interactive: Ctrl-C stops this reply, not the conversation
            if not args.interactive:
                if new:  # the text so far ends its line, as a finished reply's (then "interrupted", exit 130)
                    out.end()
                raise
            steps.close()  # a stream stopped at a step keeps the tokens it fed (as a reply cut by --max-new-tokens)
            stopped = True
        out.end()
        if args.stats:
            print(turn_stats(len(history) * resume + len(ids), len(new), t_start, t_first, t_last), file=sys.stderr,
                  flush=True)
        if stopped and not new:  # stopped before the reply began: the turn is dropped
            engine.reset()  # (the cache may hold the turn: the next one runs the conversation again)
            if args.chat:
                messages.pop()
            print("[stopped: the turn is dropped]", file=sys.stderr, flush=True)
            return
        history.extend(ids + new)
        if args.chat:
            messages.append({"role": "assistant", "content": tok.decode(new, skip_special_tokens=True)})
        if stopped:
            if _held(engine) != len(history):  # the stream was cut inside a step (a hybrid model's state)
                engine.reset()  # or the conversation differs from the tokens shown: the next turn runs it all again
            print("[stopped: the reply so far stays in the conversation]", file=sys.stderr, flush=True)

    if first is not None:
        run_turn(first)
    if args.interactive:
        # at a terminal, a prompt on stderr marks where the next turn goes (stdout stays the text)
        prompt = "> " if sys.stdin.isatty() else ""
        while True:
            if prompt:
                sys.stderr.write(prompt)
                sys.stderr.flush()
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:  # Ctrl-C at the prompt ends the session (exit 130), on a line of its own
                if prompt:
                    sys.stderr.write("\n")
                raise
            if not line:
                break
            line = line.rstrip("\r\n")  # the line end, Windows' too (stdin keeps a CR before the LF)
            if not line.strip():
                continue
            try:  # a turn that does not fit is reported; the conversation so far stays
                ids = encode_turn(line)
                _check_vocab(ids, config, tok, "this turn")  # (else the engine's words: prompts[0] ...)
                run_turn(ids)
            except ValueError as e:
                if args.chat and messages and messages[-1]["role"] == "user":
                    messages.pop()
                _fail(e, 2)
        if prompt:
            sys.stderr.write("\n")
    return 0


def _held(engine) -> int:
    """Tokens of row 0's conversation the engine holds: in its cache, and the last one sampled if it
    is pending (fed with the next turn); 0 without a conversation."""
    if engine.batch_size == 0:
        return 0
    return engine.lengths()[0] + (engine._pending[0] is not None)


def _request_sampling(sampling, k: int):
    """The sampling of the request that starts ``k`` in (a batch: its first prompt's index; an
    ``--interactive`` turn: the conversation's tokens so far). The engine seeds a generator per
    request, so with --seed each request after the first gets its own seed derived from it: the
    same seed for all would repeat the first request's draws (a prompt repeated down the file
    would get one completion in every batch). ``k == 0`` keeps the seed: the first batch or turn
    draws as a single prompt does."""
    if sampling.seed is None or sampling.greedy or k == 0:
        return sampling
    import dataclasses
    import random

    return dataclasses.replace(sampling, seed=random.Random(f"{sampling.seed}/{k}").getrandbits(63))


def _check_utf8(text: str, what: str) -> None:
    """A ``ValueError`` naming ``what`` for text the tokenizer cannot take: argv and stdin keep bytes
    that are not UTF-8 as lone surrogates, and JSON may escape one (``"\\udcff"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} is not UTF-8 text (a lone surrogate at character {e.start}: a byte that is not "
                         f"UTF-8, or half a \\u surrogate pair in JSON)") from None


def _check_vocab(ids, config, tok, what: str) -> None:
    """Token ids the model has no embedding for mean the tokenizer is not the model's: said
    before the weights load (the engine would refuse them after)."""
    if ids and max(ids) >= config.vocab_size:
        raise ValueError(f"{what} encodes to token id {max(ids)}, outside the model's vocabulary (vocab_size="
                         f"{config.vocab_size}): the tokenizer in {tok.name_or_path} does not belong to --model")


def _opening(args) -> list:
    """The messages a conversation starts with: the ``--system`` message, if any."""
    return [{"role": "system", "content": args.system}] if args.system is not None else []


def _chat_ids(tok, messages) -> list:
    """The token ids of ``messages`` in the tokenizer's chat template, ready for the reply. A
    template that refuses them (``raise_exception``: e.g. no system role) is a ``ValueError``."""
    from jinja2 import TemplateError

    try:
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except TemplateError as e:
        raise ValueError(f"--chat: the tokenizer's chat template refuses this conversation ({e}) "
                         f"(roles: {', '.join(m['role'] for m in messages)})") from None
    return ids["input_ids"] if hasattr(ids, "keys") else ids  # a BatchEncoding in newer transformers


def _after_reply(tok, messages, history) -> list:
    """The token ids the chat template renders after the last reply (``messages[-2]``): its end of
    turn, the new user turn and the generation prompt. For when the rendered conversation does not
    start with the tokens in the cache (``history``): the reply's text encodes to other tokens than
    the ones generated (cut inside a character, a merge the model did not make). The reply's end
    of turn is not repeated when the model generated it (``history``'s last token)."""
    after = _rendered_after(tok, messages, len(messages) - 2)
    if after is None:  # a template that does not render the reply: the new turn alone
        return _chat_ids(tok, messages[-1:])
    ids = tok(after, add_special_tokens=False)["input_ids"]
    return ids[1:] if ids[:1] == history[-1:] and ids[0] in tok.all_special_ids else ids


def _turn_end(tok) -> list:
    """The special token the chat template closes a reply with (ChatML's ``<|im_end|>``, Llama 3's
    ``<|eot_id|>``), as a list of its id ([] for a template without one): what SFT teaches a reply
    to end with (``orthros.training.data.encode_chat``), so --chat stops there as at EOS."""
    try:
        after = _rendered_after(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}], 1)
    except Exception:  # noqa: BLE001  (a template that takes no such conversation: EOS alone ends a reply)
        return []
    ids = tok(after or "", add_special_tokens=False)["input_ids"][:1]
    return [i for i in ids if i in tok.all_special_ids]


def _rendered_after(tok, messages, i: int):
    """The text the chat template renders after the content of ``messages[i]`` (with the generation
    prompt), or None when it does not render that content."""
    mark = "\x00orthros reply\x00"
    marked = [*messages[:i], {**messages[i], "content": mark}, *messages[i + 1:]]
    text = tok.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
    return text[text.rindex(mark) + len(mark):] if mark in text else None


def _generation_config_eos(model_dir, vocab_size: int) -> list:
    """The stop ids of the checkpoint's ``generation_config.json`` (``eos_token_id``: an id or a list,
    e.g. Llama 3 Instruct's three), which transformers' ``generate`` stops at; [] without one. Ids
    outside the vocabulary are refused before the weights load, as the tokenizer's are."""
    import json
    from pathlib import Path

    from ..utils import read_text_file
    from .engine import _eos_set

    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        d = json.loads(read_text_file(path, "--model"))
    except json.JSONDecodeError as e:
        raise ValueError(f"--model {path}: not JSON ({e.msg})") from None
    ids = d.get("eos_token_id") if isinstance(d, dict) else None
    try:
        return sorted(_eos_set(ids, vocab_size))
    except TypeError:
        raise ValueError(f"{path}: eos_token_id must be a token id or a list of them, got {ids!r}") from None
    except ValueError:
        raise ValueError(f"{path}: eos_token_id {ids!r} is outside the model's vocabulary [0, {vocab_size})") from None


def _load_engine(args, config, dtype, dev, tok, max_batch_size: int, max_seq_len=None):
    """The engine over the checkpoint's model on ``dev`` (``max_seq_len`` cache slots a row,
    default ``--max-seq-len``), and the token that ends a generation."""
    from ..models import OrthrosForCausalLM
    from ..models.loading import check_weights_fit
    from .engine import Engine, _eos_set

    eos = tok.eos_token_id if tok.eos_token_id is not None else config.eos_token_id
    try:
        _eos_set(eos, config.vocab_size)
    except ValueError:  # said before the weights load, with where the id came from
        where = "the tokenizer's" if tok.eos_token_id is not None else "config.json's"
        raise ValueError(f"{where} eos_token_id {eos!r} is outside the model's vocabulary "
                         f"[0, {config.vocab_size}): the tokenizer is not the model's") from None
    extra = set(_generation_config_eos(args.model, config.vocab_size))  # as model.generate stops there too
    if args.chat:  # a reply also ends with the template's end of turn
        extra |= {i for i in _turn_end(tok) if i < config.vocab_size}
    if extra:
        eos = sorted(_eos_set(eos, config.vocab_size) | extra)
    check_weights_fit(args.model, config)  # transformers would leave a missing tensor at random
    model = OrthrosForCausalLM.from_pretrained(str(args.model), config=config, dtype=dtype,
                                               local_files_only=True).to(dev)
    engine = Engine(model, max_batch_size=max_batch_size, max_seq_len=max_seq_len or args.max_seq_len,
                    prefill_chunk=args.prefill_chunk, cuda_graphs=(dev.type == "cuda" and not args.no_cuda_graphs),
                    compile=args.compile, gemv=True if args.gemv else False if args.no_gemv else None)
    return engine, eos


def _generate_file(args, sampling, dev, dtype, config, tok, prompts) -> int:
    """``--prompts`` (``(line, text)`` pairs): every prompt encoded and checked first (an error names
    its line), then generated ``--batch-size`` at a time; one JSON line a prompt, in the file's
    order, to stdout as each batch ends, or to ``--output`` (through a temporary name) at the end.
    A run stopped early (Ctrl-C, SIGTERM, a failure) writes the finished batches' lines to
    ``OUTPUT.partial`` (through a temporary name) and says so: ``--output`` itself is only ever
    the whole file."""
    import json

    import torch

    from ..utils import Progress, write_text
    from .engine import _eos_set, check_fits

    encoded, texts = [], [text for _, text in prompts]
    for n, text in prompts:
        where = f"--prompts {args.prompts}:{n}"
        ids = _chat_ids(tok, [*_opening(args), {"role": "user", "content": text}]) if args.chat \
            else tok(text)["input_ids"]
        if not ids:
            raise ValueError(f"{where}: the prompt encodes to no tokens")
        _check_vocab(ids, config, tok, f"{where}: the prompt")
        check_fits(0, len(ids), args.max_new_tokens, max_seq_len=args.max_seq_len,
                   max_positions=config.max_position_embeddings, where=where, names=CLI_NAMES)
        encoded.append(ids)
    bs = min(args.batch_size, len(encoded))
    # cache slots for the longest request only (each batch starts afresh): bs x 8192 slots by default
    # would hold far more memory than short prompts need
    need = max(len(ids) for ids in encoded) + args.max_new_tokens - 1
    engine, eos = _load_engine(args, config, dtype, dev, tok, max_batch_size=bs, max_seq_len=need)
    stops = _eos_set(eos, config.vocab_size)  # one id, or the model config's list of them
    lines, t0, n_new = [], time.perf_counter(), 0
    try:
        with Progress(len(encoded), "orthros generate", unit="prompt") as bar, torch.no_grad():
            for start in range(0, len(encoded), bs):
                batch = encoded[start:start + bs]
                outs = engine.generate(batch, args.max_new_tokens, _request_sampling(sampling, start),
                                       eos_token_id=eos)
                done = []
                for text, ids, new in zip(texts[start:start + bs], batch, outs):
                    ended = bool(new) and new[-1] in stops
                    done.append(json.dumps({"prompt": text, "completion": tok.decode(new, skip_special_tokens=True),
                                            "prompt_tokens": len(ids), "new_tokens": len(new),
                                            "finish": "eos" if ended else "length"}, ensure_ascii=False) + "\n")
                    n_new += len(new)
                lines += done
                if args.output is None:  # a stream: each batch's lines as it ends
                    sys.stdout.write("".join(done))
                    sys.stdout.flush()
                bar.update(len(batch))
    except BaseException as e:  # Ctrl-C, SIGTERM (Terminated), a failure: keep what is finished, apart
        said = f"orthros generate: stopped after {len(lines)} of {len(encoded)} prompts"
        if args.output is None:
            if lines and not isinstance(e, BrokenPipeError):  # (a reader gone, e.g. `| head`: nothing to say)
                print(f"{said}: their lines are on stdout", file=sys.stderr, flush=True)
        elif lines:
            out, stream, partial = _partial_path(args.output)
            dest = out if stream else partial
            write_text(dest, "".join(lines))
            print(f"{said}: their lines are in {dest}" + ("" if stream else f" (--output {args.output} is not written)"),
                  file=sys.stderr, flush=True)
        else:
            _, stream, partial = _partial_path(args.output)
            if not stream and partial.is_file():  # not to be taken for this run's
                print(f"{said}; {partial} is of an earlier run", file=sys.stderr, flush=True)
        raise
    if args.output is not None:
        write_text(args.output, "".join(lines))
        _, stream, partial = _partial_path(args.output)
        if not stream and partial.is_file():  # an earlier run's, stopped early: the whole file replaces it
            partial.unlink()
            print(f"orthros generate: removed {partial} (an earlier run's lines; --output {args.output} is whole)",
                  file=sys.stderr, flush=True)
    if args.stats:
        secs = time.perf_counter() - t0
        print(f"[stats] {len(lines)} prompts in batches of {bs}: {n_new} new tokens in {secs:.2f} s "
              f"({n_new / max(secs, 1e-9):.1f} tokens/s, prefill included)", file=sys.stderr, flush=True)
    return 0


def _partial_path(output):
    """``(out, stream, partial)`` of ``--output``: its path (``~`` expanded), whether it is a pipe or
    a device (written as it is, a stopped run's lines too), and the ``OUTPUT.partial`` file beside it
    that a run stopped early writes its finished lines to (beside a symbolic link, not its target)."""
    from ..utils import expand_path, written_in_place

    out = expand_path(output, "--output")
    return out, written_in_place(out), out.with_name(out.name + ".partial")


if __name__ == "__main__":
    sys.exit(main())
