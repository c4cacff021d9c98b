"""Embedded offline data: a public-domain English corpus, a BPE tokenizer, an SFT sample.

See ``orthros/data/README.md`` for the source and licence of each file.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent
CORPUS_TRAIN = DATA_DIR / "corpus" / "shakespeare_train.jsonl"
CORPUS_EVAL = DATA_DIR / "corpus" / "shakespeare_eval.jsonl"
SFT_TRAIN = DATA_DIR / "sft" / "shakespeare_sft_train.jsonl"
SFT_EVAL = DATA_DIR / "sft" / "shakespeare_sft_eval.jsonl"
TOKENIZER_DIR = DATA_DIR / "tokenizer"


def embedded_paths(kind: str) -> tuple[str, str]:
    """(train, eval) JSONL paths of the embedded ``"pt"`` corpus or ``"sft"`` sample."""
    if kind == "sft":
        return str(SFT_TRAIN), str(SFT_EVAL)
    return str(CORPUS_TRAIN), str(CORPUS_EVAL)


def load_tokenizer(path: str | None = None):
    """The embedded tokenizer (``path`` None or ``"embedded"``) or any HF tokenizer."""
    from transformers import AutoTokenizer

    if path in (None, "embedded"):
        path = str(TOKENIZER_DIR)
    return AutoTokenizer.from_pretrained(path)


__all__ = ["DATA_DIR", "CORPUS_TRAIN", "CORPUS_EVAL", "SFT_TRAIN", "SFT_EVAL", "TOKENIZER_DIR",
           "embedded_paths", "load_tokenizer"]
