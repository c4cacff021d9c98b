"""``orthros convert SRC DST``: write an Orthros checkpoint converted from a Llama / Qwen2 / Qwen3 /
Mistral checkpoint directory."""

from __future__ import annotations

import argparse
import sys

from .architectures import SUPPORTED_ARCHITECTURES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="orthros convert",
        description="Convert an HF checkpoint directory (" + ", ".join(SUPPORTED_ARCHITECTURES) + ") into an "
                    "Orthros checkpoint directory: same weights, attention swapped for Orthros attention with "
                    "alpha=alpha'=1, beta=beta'=0. Streams one tensor at a time; the result appears at DST "
                    "only when complete. Continue pre-training it with `orthros train <config.yaml>`.",
    )
    p.add_argument("src", metavar="SRC", help="source checkpoint directory (config.json + safetensors)")
    p.add_argument("dst", metavar="DST", help="output directory (must not exist or be empty, unless --overwrite)")
    p.add_argument("--window-size", type=int, default=128, metavar="N",
                   help="sliding window of the base stream, the query's own position included (default: 128)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None,
                   help="cast floating-point weights (default: keep the source's dtypes)")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists and is not empty")
    p.add_argument("--no-scale-offset", dest="scale_offset", action="store_false",
                   help="do not add the learnable alpha/beta query transforms")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.window_size < 1:
        print(f"orthros convert: error: --window-size must be >= 1, got {args.window_size}", file=sys.stderr)
        return 2
    from .convert import convert_checkpoint

    try:
        report = convert_checkpoint(args.src, args.dst, window_size=args.window_size, dtype=args.dtype,
                                    overwrite=args.overwrite, scale_offset=args.scale_offset,
                                    progress=not args.quiet)
    except (ValueError, OSError) as e:
        print(f"orthros convert: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"converted {report['architecture']} -> Orthros (window {report['window_size']}, dtype "
              f"{report['dtype']}): {len(report['mapped'])} tensors mapped, {len(report['added'])} added, "
              f"{len(report['dropped'])} dropped, {len(report['copied_files'])} files copied -> {args.dst}")
        for note in report["notes"]:
            print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
