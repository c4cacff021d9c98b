"""Build the embedded SFT sample (chat ``messages`` JSONL) from the embedded corpus.

Every example is derived mechanically from the public-domain plays, so the answers are
exactly right by construction (no model wrote them). Three tasks:

* ``continue``: a passage of a scene -> the next lines of that scene;
* ``next_word``: a line cut mid-way -> the word that follows in the text;
* ``speaker``: a speech -> the name of the character who speaks next; followed in the
  same conversation by a second turn asking for that character's next line, so that some
  examples have two assistant turns (loss on both).

Train examples come from the training plays, eval examples from the held-out plays.
Re-run with ``python -m orthros.data.build_sft`` (deterministic, seed 0: it reproduces the
shipped files byte for byte; ``--out DIR`` writes elsewhere).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from ..utils import file_in_the_way, write_text

HERE = Path(__file__).parent
SYSTEM = "You are a helpful assistant who knows the plays of Shakespeare."


def _speeches(text: str) -> list[tuple[str, list[str]]]:
    out, cur = [], None
    for line in text.splitlines()[3:]:
        m = re.match(r"^([A-Z][A-Z .'\-]+):$", line)
        if m:
            cur = (m.group(1).strip(), [])
            out.append(cur)
        elif cur is not None and line and not line.startswith("["):
            cur[1].append(line)
    return [s for s in out if s[1]]


def _examples(doc: dict, rng: random.Random) -> list[dict]:
    play, text = doc["play"], doc["text"]
    lines = [l for l in text.splitlines()[3:] if l.strip()]
    ex = []
    if len(lines) > 12:
        i = rng.randrange(0, len(lines) - 12)
        k = rng.randint(4, 8)
        ex.append({"task": "continue", "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Continue this passage from {play}:\n\n" + "\n".join(lines[i:i + k])},
            {"role": "assistant", "content": "\n".join(lines[i + k:i + k + 4])},
        ]})
    verse = [l for l in lines if len(l.split()) >= 5 and not l.endswith(":") and not l.startswith("[")]
    if verse:
        words = rng.choice(verse).split()
        j = rng.randint(2, len(words) - 1)
        nxt = words[j].strip(".,;:!?'\"()")
        if nxt:
            ex.append({"task": "next_word", "messages": [
                {"role": "user", "content": f'In {play}, which word comes after "{" ".join(words[:j])}"?'},
                {"role": "assistant", "content": nxt},
            ]})
    sp = _speeches(text)
    if len(sp) > 2:
        i = rng.randrange(0, len(sp) - 1)
        who, said = sp[i]
        nwho, nsaid = sp[i + 1]
        ex.append({"task": "speaker", "messages": [
            {"role": "user", "content": f"In {play}, {who.title()} says:\n\n" + "\n".join(said[:4]) + "\n\nWho speaks next?"},
            {"role": "assistant", "content": nwho.title()},
            {"role": "user", "content": "What is the first line they say?"},
            {"role": "assistant", "content": nsaid[0]},
        ]})
    return ex


def _read_corpus(p: argparse.ArgumentParser, file: Path) -> list[dict]:
    """The scenes of a corpus JSONL file; a parser error naming the file and line of one that is
    not a JSON object with string ``play`` and ``text`` fields."""
    docs = []
    with open(file, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                d = json.loads(line)
            except ValueError as e:
                p.error(f"--corpus {file}: line {n} is not JSON ({e})")
            if not (isinstance(d, dict) and isinstance(d.get("play"), str) and isinstance(d.get("text"), str)):
                p.error(f"--corpus {file}: line {n} is not an object with string 'play' and 'text' fields")
            docs.append(d)
    return docs


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=str(HERE / "corpus"),
                   help="folder of shakespeare_{train,eval}.jsonl (default: the embedded corpus)")
    p.add_argument("--out", default=str(HERE / "sft"), help="folder to write shakespeare_sft_{train,eval}.jsonl to (default: the embedded SFT "
                        "sample's, replacing the shipped files)")
    a = p.parse_args(argv)
    corpus, out = Path(a.corpus), Path(a.out)
    splits = {s: corpus / f"shakespeare_{s}.jsonl" for s in ("train", "eval")}
    missing = [str(f) for f in splits.values() if not f.is_file()]
    if missing:
        p.error(f"--corpus {corpus}: no {' or '.join(missing)}")
    if (blocked := file_in_the_way(out)) is not None:  # OUT, or a folder above it, is a file
        p.error(f"--out {out}: not a folder ({blocked} is a file)")
    # both splits read (and checked) before anything is written: a bad line is no half-written pair
    docs = {split: _read_corpus(p, file) for split, file in splits.items()}
    rng = random.Random(0)
    for split, rounds in (("train", 2), ("eval", 1)):
        ex = []
        for _ in range(rounds):
            for d in docs[split]:
                ex.extend(_examples(d, rng))
        rng.shuffle(ex)
        write_text(out / f"shakespeare_sft_{split}.jsonl", "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in ex))
        print(split, len(ex))


if __name__ == "__main__":
    main()
