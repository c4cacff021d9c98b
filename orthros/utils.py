"""Small vocabularies every layer of the package shares: dtype names, argument checks, the
commit a measurement ran at, and writing a JSON file or a figure without leaving half a file.

This module imports nothing heavy (torch only inside :func:`parse_dtype`), so anything (ops,
the CLIs' argument parsers) may import it.
"""

from __future__ import annotations

# user-facing dtype names (CLI flags, configs, JSON) -> torch dtype attribute names
DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32",
}
DTYPE_CHOICES = ("bf16", "fp16", "fp32")  # the short names CLIs offer
_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def parse_dtype(value, name: str = "dtype"):
    """The torch dtype for a name in :data:`DTYPE_ALIASES` (or a bf16/fp16/fp32 torch dtype,
    returned as is); ``ValueError`` naming ``name`` otherwise."""
    import torch

    if isinstance(value, torch.dtype):
        if str(value).replace("torch.", "") in _SHORT:
            return value
    elif isinstance(value, str) and value.lower() in DTYPE_ALIASES:
        return getattr(torch, DTYPE_ALIASES[value.lower()])
    raise ValueError(f"{name} must be one of {', '.join(DTYPE_CHOICES)}, got {value!r}")


def dtype_name(dtype) -> str:
    """The short name (``bf16`` / ``fp16`` / ``fp32``) of a torch dtype."""
    return _SHORT.get(str(dtype).replace("torch.", ""), str(dtype))


def check_positive_int(name: str, value, *, allow_none: bool = False):
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an int >= 1 (or ``None`` when
    allowed); return ``value``."""
    if allow_none and value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1{' or None' if allow_none else ''}, got {value!r}")
    return value


def save_figure(fig, path, dpi: int = 120) -> None:
    """Write a matplotlib figure to ``path`` (its folder made) through a temporary name in the
    same folder, then rename, and close the figure: a reader never sees half a PNG."""
    import os
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp" + path.suffix)  # the suffix tells matplotlib the format
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        import matplotlib.pyplot as plt

        plt.close(fig)


__all__ = ["DTYPE_ALIASES", "DTYPE_CHOICES", "parse_dtype", "dtype_name", "check_positive_int", "save_figure"]


def write_json(path, obj, *, indent: int = 2, default=None) -> None:
    """Write ``obj`` as JSON to ``path`` (its folder made) through a temporary name in the same
    folder, then rename: a reader (or a run killed mid-write) never sees half a file."""
    import json
    import os
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=indent, default=default) + "\n")
    os.replace(tmp, path)


def commit_id():
    """The commit a measurement runs at: ``$ORTHROS_COMMIT`` (set where the tree travels without
    its .git, e.g. the GPU machine), else ``git rev-parse --short HEAD`` of this checkout, else
    ``None``."""
    import os
    import subprocess

    c = os.environ.get("ORTHROS_COMMIT")
    if c:
        return c
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001  (no git, not a checkout)
        return None
