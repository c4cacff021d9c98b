"""``orthros convert SRC DST``: write an Orthros checkpoint converted from a Llama / Qwen2 / Qwen3 /
Mistral checkpoint directory or GGUF file (a Qwen3.5 directory: Orthros-H).

SIGINT and SIGTERM stop it cleanly: the temporary directory is removed, one line is printed,
and the exit code is 130 (SIGINT) or 143 (SIGTERM). What a ``kill -9`` leaves is removed by
the next run into the same DST."""

from __future__ import annotations

import argparse
import signal
import sys

from ..utils import Terminated, check_not_blank, expand_path, format_bytes, sigterm_as_interrupt
from . import qwen3_5
from .architectures import SUPPORTED_ARCHITECTURES
from .checks import check_local_source


# the conversion's errors in this command's option names (checks.API_NAMES: the Python API's keywords)
CLI_NAMES = {"overwrite": "--overwrite", "window_size": "--window-size", "dtype": "--dtype", "dry_run": "--dry-run",
             "download": "a run without --dry-run"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="orthros convert",
        description="Convert an HF checkpoint directory or a GGUF file (" + ", ".join(SUPPORTED_ARCHITECTURES) +
                    "; GGUF files are de-quantised to float32 first and need the gguf and accelerate packages) into an "
                    "Orthros checkpoint directory: same weights, attention swapped for Orthros attention with "
                    "alpha=alpha'=1, beta=beta'=0. Streams one tensor at a time; the result appears at DST "
                    "only when complete. Continue pre-training it with `orthros train <config.yaml>`.",
    )
    p.add_argument("src", metavar="SRC", help="source checkpoint directory (config.json + safetensors), a .gguf "
                                              "file, or a directory holding one .gguf file; a name such as "
                                              "owner/model that is no local path is a Hugging Face hub id, "
                                              "downloaded when the hub is reachable")
    p.add_argument("dst", metavar="DST", help="output directory (must not exist or be empty, unless --overwrite)")
    p.add_argument("--window-size", type=int, default=128, metavar="N",
                   help="sliding window of the base stream, the query's own position included (default: 128)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None,
                   help="cast floating-point weights (default: keep the source's dtypes; a GGUF's: float32, "
                        "as de-quantised)")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists and is not empty")
    p.add_argument("--no-scale-offset", dest="scale_offset", action="store_false",
                   help="do not add the learnable alpha/beta query transforms")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar, no summary and no notes after the conversion (errors and --dry-run's "
                        "plan are still printed)")
    p.add_argument("--dry-run", action="store_true",
                   help="make every check the conversion makes before it writes, print what it would write, "
                        "write and download nothing (a hub id is read from the local Hugging Face cache)")
    return p


def format_plan(plan: dict) -> str:
    """What ``orthros convert --dry-run`` prints (:func:`orthros.conversion.convert.plan_conversion`)."""
    rows = [("source", f"{plan['architecture']}, {plan['source']} ({plan['source_format']})")]
    dst = f"{plan['dst']} ({'replaced: --overwrite' if plan['dst_exists'] else 'new'})"
    kind = "Orthros-H" if plan["architecture"] == qwen3_5.ARCHITECTURE else "Orthros"  # GDN layers kept
    rows.append(("result", f"{kind}, window {plan['window_size']}, {plan['dtype']}"
                           f"{'' if plan['scale_offset'] else ', no scale-offset'} -> {dst}"))
    if plan["source_format"] == "gguf":
        types = ", ".join(f"{t} {n}" for t, n in plan["tensor_types"].items())
        rows.append(("tensors", f"{plan['tensors']} in the GGUF ({types}), {plan['parameters']:,} parameters; "
                                f"de-quantised to float32 first, then mapped as a safetensors source"))
    else:
        by_reason = {}  # one entry a reason: an old Llama's inv_freq buffers, Qwen3.5's mtp head, were a name each
        for name, reason in plan["dropped"].items():
            by_reason.setdefault(reason, []).append(name)
        dropped = "; ".join(f"{names[0]}: {r}" if len(names) == 1 else f"{len(names)} tensors ({names[0]} ...): {r}"
                            for r, names in by_reason.items())
        rows.append(("tensors", f"{plan['mapped']} mapped from {plan['files']} file{'s' if plan['files'] != 1 else ''}, "
                                f"{plan['added']} added{' (alpha/beta at 1/0)' if plan['added'] else ''}, "
                                f"{len(plan['dropped'])} dropped"
                                + (f" ({dropped})" if dropped else "")))
        copied = ", ".join(plan["copied_files"]) or "none"
        rows.append(("other files", f"copied: {copied}" +
                     "".join(f"; skipped {s['file']} ({s['reason']})" for s in plan["skipped_files"])))
    rows += [("note", n) for n in plan["notes"]]
    if plan.get("staging_bytes"):  # a GGUF's: was "about 2.5 MiB written" of a result of half that, no word why
        staging = plan["staging_bytes"]
        rows.append(("disk", f"about {format_bytes(plan['bytes_needed'])} at the peak: the result, about "
                             f"{format_bytes(plan['bytes_needed'] - staging)}, beside a float32 staging copy "
                             f"({format_bytes(staging)}) removed when done"))
    else:
        rows.append(("disk", f"about {format_bytes(plan['bytes_needed'])} written"))
    return "\n".join(["orthros convert --dry-run: every check passed; nothing was written"] +
                     [f"  {k:<12} {v}" for k, v in rows])


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    for name, value in (("SRC", args.src), ("DST", args.dst)):
        try:  # "" is the current directory to pathlib: an unset shell variable, not a choice
            check_not_blank(value, name, hint="name a path ('.' for the current directory)")
            expand_path(value, name)  # ~NAME of no user: named as the command line names it
        except ValueError as e:
            print(f"orthros convert: error: {e}", file=sys.stderr)
            return 2
    if args.window_size < 1:
        print(f"orthros convert: error: --window-size must be >= 1, got {args.window_size}", file=sys.stderr)
        return 2
    try:
        with sigterm_as_interrupt():  # SIGTERM removes the temporary directory, as Ctrl-C does
            check_local_source(args.src, args.dst, CLI_NAMES)  # no torch yet: a wrong SRC is refused at once
            from .convert import convert_checkpoint, plan_conversion

            if args.dry_run:  # printed below, out of the try: a closed stdout is no conversion error
                plan = plan_conversion(args.src, args.dst, window_size=args.window_size, dtype=args.dtype,
                                       overwrite=args.overwrite, scale_offset=args.scale_offset, names=CLI_NAMES)
            else:
                report = convert_checkpoint(args.src, args.dst, window_size=args.window_size, dtype=args.dtype,
                                            overwrite=args.overwrite, scale_offset=args.scale_offset,
                                            progress=not args.quiet, names=CLI_NAMES)
    except Terminated:
        print(f"orthros convert: terminated (SIGTERM); nothing was written to {args.dst}", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"orthros convert: interrupted; nothing was written to {args.dst}", file=sys.stderr)
        return 128 + signal.SIGINT
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError) as e:  # bad input: 2, as everywhere
        print(f"orthros convert: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ImportError) as e:  # a failure while working
        print(f"orthros convert: error: {e}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(format_plan(plan))
    elif not args.quiet:
        print(f"converted {report['architecture']} -> Orthros (window {report['window_size']}, dtype "
              f"{report['dtype']}): {len(report['mapped'])} tensors mapped, {len(report['added'])} added, "
              f"{len(report['dropped'])} dropped, {len(report['copied_files'])} other "
              f"file{'s' if len(report['copied_files']) != 1 else ''} copied -> {args.dst}")
        for note in report["notes"]:
            print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
