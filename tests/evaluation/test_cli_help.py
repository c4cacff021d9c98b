"""`orthros eval ... --help` says every option's default."""

import argparse

import pytest

from orthros.evaluation.cli import build_parser


def _subparsers():
    p = build_parser()
    (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_help_names_every_default(name):
    """Issue: --vocab-size, --num-pairs, --power, --fill, --models, --window, --jobs (mqar), --lengths, --depths,
    --samples, --haystack, --engine (niah), --mode, --min-len, --max-len (niah-train) ran with a default their
    help did not name."""
    sp = _subparsers()[name]
    fmt = sp._get_formatter()
    unsaid = []
    for a in sp._actions:
        if not a.option_strings or a.default in (None, False, argparse.SUPPRESS):
            continue
        text = fmt._expand_help(a) if a.help else ""
        said = {str(a.default)}
        if isinstance(a.default, float):
            said |= {format(a.default, "g"), f"{a.default:.0e}".replace("e-0", "e-")}
        if "default" not in text or not any(v in text for v in said):
            unsaid.append(f"{a.option_strings[0]} (default {a.default!r}): {text!r}")
    assert not unsaid, unsaid
