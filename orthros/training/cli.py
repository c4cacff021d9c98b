"""``orthros train CONFIG.yaml [--key value ...]`` and ``python -m orthros.train``.

For the shared ``orthros`` CLI: call :func:`add_parser` with the subparsers object, or route
``orthros train ...`` to :func:`main` with the arguments after ``train``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Optional

USAGE = """orthros train [CONFIG.yaml] [--key value ...] [--resume [PATH]] [--dry-run] [--help-config]

Train an Orthros (or Transformer / SWA baseline) model: modes pt, sft, cpt.
With no config, trains a tiny Orthros model on the embedded Shakespeare corpus (offline).

  CONFIG.yaml       a YAML file of config keys (--help-config lists them; configs/ has examples)
  --key value       override one key, once: dotted (--optim.lr 3e-4) or a unique leaf (--lr 3e-4)
  --resume [PATH]   continue from the latest checkpoint in output_dir (or from PATH)
  --help-config     list every key with its default and what it means
  --dry-run         make every check the run makes before it starts (config, output_dir, resume
                    point, tokenizer, data), print what it would train, write nothing

Several processes: torchrun --nproc-per-node N -m orthros.train CONFIG.yaml (FSDP2).
Ctrl-C or SIGTERM (a scheduler's preemption, torchrun stopping its workers) stops the run at once
(exit 130 / 143): the checkpoints already written stay, one cut short is removed; --resume goes on.
"""


def main(argv: Optional[list[str]] = None) -> int:
    """Run ``orthros train`` with ``argv`` (the arguments after ``train``). Returns an exit code."""
    from .config import ConfigError, describe_keys, load_config

    argv = list(sys.argv[1:] if argv is None else argv)
    if os.environ.get("WORLD_SIZE", "1") != "1" and hasattr(sys.stderr, "reconfigure"):
        # torchrun's processes share one stderr, and each reports a refused config: a line goes out in
        # one write (print's text and its newline were two, so the processes' lines interleaved mid-line)
        sys.stderr.reconfigure(line_buffering=True, write_through=False)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    if "--help-config" in argv:
        print("config keys and defaults:\n" + describe_keys())
        return 0
    dry = "--dry-run" in argv
    argv = [a for a in argv if a != "--dry-run"]  # before the config file is picked: --dry-run CONFIG.yaml
    path = None
    if argv and not argv[0].startswith("-"):  # (-c c.yaml: no config file named '-c')
        path, argv = argv[0], argv[1:]
    from ..utils import Terminated, sigterm_as_interrupt

    cfg = None
    try:
        with sigterm_as_interrupt():  # in the main thread: a handler cannot be set elsewhere
            cfg = load_config(path, argv)
            from .trainer import dry_run, train

            if dry:
                plan = dry_run(cfg)
                if os.environ.get("RANK", "0") == "0":  # under torchrun, one copy of it
                    print(plan)
            else:
                train(cfg)
    except (ConfigError, *_data_errors()) as e:
        print(f"orthros train: error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as e:  # as Ctrl-C: the run stops, its checkpoints stay
        return _stopped(e, cfg, dry)
    return 0


def _data_errors() -> tuple:
    """``(DataError,)`` once the data module is loaded (only its code raises one), else ``()``: imported up
    front, it loaded torch (seconds) before a config file that is not there was named."""
    data = sys.modules.get(f"{__package__}.data")
    return (data.DataError,) if data is not None else ()


def _stopped(e: BaseException, cfg, dry: bool) -> int:
    """Report a run stopped by Ctrl-C (exit 130) or SIGTERM (143), and where it can go on from."""
    ctrl_c = isinstance(e, KeyboardInterrupt)
    what = "interrupted" if ctrl_c else "terminated (SIGTERM)"
    if os.environ.get("RANK", "0").strip() in ("0", ""):  # every process of torchrun gets it: one line
        if cfg is None or dry:
            print(f"orthros train: {what}" + ("; nothing was written" if dry else ""), file=sys.stderr)
        else:
            from .checkpoint import latest_checkpoint

            last = latest_checkpoint(cfg.output_dir)
            print(f"orthros train: {what}; " + (f"the latest checkpoint is {last}: --resume goes on from it" if last
                                                 else "no checkpoint was written"), file=sys.stderr)
    return 128 + (signal.SIGINT if ctrl_c else signal.SIGTERM)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``train`` on an argparse subparsers object; the handler is ``args.func(args)``."""
    p = subparsers.add_parser("train", help="pre-train / fine-tune / continue pre-training (see configs/)",
                              description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
                              add_help=False)
    p.add_argument("train_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: main(args.train_args))
    return p
