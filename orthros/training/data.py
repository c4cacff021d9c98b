"""Data pipeline: documents from ``datasets`` -> tokens -> packed rows with document boundaries.

* PT/CPT: every document is tokenized and ends with EOS; documents are packed back to back
  into rows of ``seq_len`` tokens (a long document continues in the next row). Each piece of
  a document in a row is one segment of ``cu_seqlens``: the model restarts RoPE positions and
  attends only inside it, and the label at each segment's first token is -100, so no position
  predicts a token of another document.
* SFT: each chat example is rendered with the tokenizer's chat template; labels are the token
  ids of assistant answers (every assistant turn, its end marker included) and -100 elsewhere.
  Examples are packed whole (never split); a row that cannot take the next example is padded
  with a pad segment whose labels are -100.
* Long-range variant (pt/cpt, ``data.repeat_passage: N``): each document's tokens are cut into
  passages of N tokens (a shorter tail is dropped) and every passage becomes its own document
  ``P P EOS``, so the second copy is predictable only by looking N tokens back. Such a
  document is packed whole (never split over two rows; the row is padded instead), so the
  first copy is always in the same ``cu_seqlens`` segment as the second.

The stream is deterministic for a seed and resumable exactly: its state is (epoch, index of
the document being consumed in that epoch's order, tokens of it already emitted).
All processes read the same global stream and take their own rows of each global batch,
so one process with ``grad_accum = N`` sees exactly the batches of N processes.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from ..utils import expand_path
from .config import ConfigError

IGNORE = -100

_EXT_FORMAT = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
               ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


class DataError(ValueError):
    """Bad or empty data, reported before training starts."""


# --------------------------------------------------------------------------- sources


def _strip_compression(path: str) -> str:
    for ext in (".gz", ".bz2", ".xz", ".zst", ".lz4"):
        if path.endswith(ext):
            return path[: -len(ext)]
    return path


def _file_format(path: str) -> Optional[str]:
    """The ``datasets`` builder of a data file from its extension (compressed too), or None."""
    return _EXT_FORMAT.get(Path(_strip_compression(path)).suffix)


def _formats_text() -> str:
    """The data files' formats and their extensions, for an error: 'text (.txt, .text, .md), json (...)'."""
    by: dict[str, list[str]] = {}
    for ext, fmt in _EXT_FORMAT.items():
        by.setdefault(fmt, []).append(ext)
    parts = [fmt if exts == [f".{fmt}"] else f"{fmt} ({', '.join(exts)})" for fmt, exts in by.items()]
    return f"{', '.join(parts[:-1])} or {parts[-1]} (compressed too)"


def _resolve_files(spec, name: str = "data.train") -> Optional[list[str]]:
    """Local files named by ``spec`` (path, dir, glob, or list), or None when nothing local matches;
    ``name``: the config key that names them, in its errors."""
    specs = spec if isinstance(spec, (list, tuple)) else [spec]
    files = []
    for s in specs:
        s = str(s)
        if s.startswith("~"):  # os.path.expanduser kept ~NAME of no user as typed: 'data file not found'
            try:
                s = str(expand_path(s, name))
            except ValueError as e:
                raise DataError(str(e)) from None
        if os.path.isdir(s):
            found = sorted(p for p in glob.glob(os.path.join(s, "**", "*"), recursive=True)
                           if os.path.isfile(p) and _file_format(p))
            if not found:
                raise DataError(f"{name}: data directory {s} holds no .txt/.json/.jsonl/.parquet/.csv/.arrow files")
            cards = [p for p in found if os.path.basename(p).lower() == "readme.md"]
            if cards and any(_file_format(p) != "text" for p in found):  # a dataset's card, not one of its documents
                found = [p for p in found if p not in cards]
            files.extend(found)
        elif any(c in s for c in "*?["):
            found = sorted(p for p in glob.glob(s, recursive=True) if os.path.isfile(p))
            if not found:
                raise DataError(f"{name}: data glob {s!r} matches no file")
            files.extend(found)
        elif os.path.isfile(s):
            files.append(s)
        else:
            # a data file's extension (train.jsonl, no folder: run from another one) is a file, not a hub name
            if len(specs) > 1 or _file_format(s) or os.sep in s and (s.startswith((".", "/", "~")) or Path(s).suffix):
                where = "" if os.path.isabs(s) else f" (looked for in {os.getcwd()})"
                parts = [x for x in re.split(r"[,\s]+", s) if x]
                if len(specs) == 1 and len(parts) > 1:  # 'a.txt,b.txt': one name
                    where += f" (several are a list: [{', '.join(parts)}])"
                raise DataError(f"{name}: data file not found: {s}{where}")
            return None
    return files


class DocSource:
    """Documents of one dataset in a seeded per-epoch order, readable from any position."""

    def __init__(self, spec, *, fmt: str = "auto", streaming: bool = False, shuffle: bool = True,
                 seed: int = 0, shuffle_buffer: int = 10000, text_sample_by: str = "document",
                 name: str = "data.train"):
        import datasets

        datasets.disable_progress_bars()
        self.name, self.spec, self.shuffle, self.seed = name, spec, shuffle, seed
        self.streaming, self.shuffle_buffer = streaming, shuffle_buffer
        files = None if fmt == "hub" else _resolve_files(spec, name)
        kwargs = {}
        if files is None:
            from .hub import check_hub_name

            check_hub_name(name, str(spec), "dataset")
            builder, load_args = str(spec), {}
        else:
            fmts = {_file_format(f) for f in files} if fmt == "auto" else {fmt}
            fmts.discard(None)
            if len(fmts) > 1:  # data.format would read them all as one format
                raise DataError(f"{name}: the files are of several formats ({', '.join(sorted(fmts))}); the data "
                                f"of one key must be of one format: {files[:3]}")
            if not fmts:  # .npy / .bin: pre-tokenized files, which no data.format reads
                raise DataError(f"{name}: cannot tell the format of {', '.join(files[:3])} from its extension: "
                                f"data files are {_formats_text()}; token files are not read; data.format names "
                                f"the format of a file of another extension")
            if all(os.path.getsize(f) == 0 for f in files):  # datasets' own error names no reason
                what = files[0] if len(files) == 1 else f"every file of {files[:3]}"
                raise DataError(f"{name}: {what} is empty (0 bytes)")
            builder = fmts.pop()
            load_args = {"data_files": files}
            if builder == "text":
                kwargs["sample_by"] = text_sample_by
        try:
            ds = datasets.load_dataset(builder, split="train", streaming=streaming, **load_args, **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised with the data key named
            if files and isinstance(e, ValueError) and "corresponds to no data" in str(e):  # blank lines, [], a header
                what = files[0] if len(files) == 1 else f"every file of {files[:3]}"
                raise DataError(f"{name}: {what} holds no records (0 rows)") from None
            where = f"files {files[:3]}" if files else f"'{spec}' (not a local path, so tried as a hub dataset)"
            why, cause = [], e
            while cause is not None:  # datasets wraps the reason (a parse error, ...) in a generic error
                text = " ".join(str(cause).split())  # one line: datasets' messages run to a dozen
                why.append(f"{type(cause).__name__}: {text[:400] + ' ...' if len(text) > 400 else text}")
                cause = cause.__cause__
            raise DataError(f"{name}: could not load {where}: {' <- '.join(why)}") from None
        self.ds = ds
        # how it was read: "text" for .txt files (the one data.text_sample_by applies to), "json", ... or "hub"
        self.builder = "hub" if files is None else builder
        self.columns = list(ds.column_names or []) if ds.column_names is not None else None
        if streaming:
            self.num_docs = None
        else:
            self.num_docs = len(ds)
            if self.num_docs == 0:
                raise DataError(f"{name}: dataset {spec!r} is empty (0 documents)")

    def check_column(self, column: str, key: str = "data.text_field") -> None:
        """``column`` (the value of config ``key``, the field the mode reads) is one of the dataset's."""
        if self.columns is not None and column not in self.columns:
            raise DataError(f"{self.name}: dataset has no column '{column}' (columns: {self.columns}); "
                            f"set {key} to one of them")

    def row(self, epoch: int, i: int) -> Optional[int]:
        """The dataset row of document ``i`` of ``epoch``'s order (None: a shuffled stream's)."""
        if self.num_docs is not None:
            return int(self.order(epoch)[i])
        return None if self.shuffle else i

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_docs)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_docs)

    def batches(self, epoch: int, start: int, batch: int) -> Iterator[list[tuple[int, dict]]]:
        """Yield lists of (index in this epoch's order, record), from ``start`` on."""
        if self.num_docs is not None:
            order = self.order(epoch)
            for i in range(start, self.num_docs, batch):
                idx = order[i:i + batch].tolist()
                cols = self.ds[idx]
                keys = list(cols.keys())
                yield [(i + j, {k: cols[k][j] for k in keys}) for j in range(len(idx))]
            return
        ds = self.ds
        if self.shuffle:
            ds = ds.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
            ds.set_epoch(epoch)
        # skip by reading (no tokenization): the same records in the same order as the first pass
        out, i = [], start
        for rec in itertools.islice(ds, start, None):
            out.append((i, rec))
            i += 1
            if len(out) == batch:
                yield out
                out = []
        if out:
            yield out


# --------------------------------------------------------------------------- encoders


def encode_text_batch(tokenizer, texts: list, eos_id: Optional[int]) -> list[Optional[tuple[list, list]]]:
    """PT documents: token ids (+ EOS); labels are the ids (the segment start is masked later)."""
    clean = [t if isinstance(t, str) else "" for t in texts]
    ids_list = tokenizer(clean, add_special_tokens=False)["input_ids"]
    out = []
    for ids in ids_list:
        if not ids:
            out.append(None)
            continue
        if eos_id is not None:
            ids = list(ids) + [eos_id]
        out.append((list(ids), list(ids)))
    return out


def encode_repeat_batch(tokenizer, texts: list, eos_id: Optional[int],
                        passage: int) -> list[Optional[tuple[list, list, list]]]:
    """Long-range PT documents: each text's tokens cut into passages P of ``passage`` tokens
    (a shorter tail dropped), each written twice and closed by EOS: ``P P EOS`` ...

    Returns, per text, (ids, labels, cuts) with ``cuts`` the end offsets of the ``P P EOS``
    units in ``ids`` (each unit is a document of its own for packing), or None when the
    text has fewer than ``passage`` tokens.
    """
    clean = [t if isinstance(t, str) else "" for t in texts]
    ids_list = tokenizer(clean, add_special_tokens=False)["input_ids"]
    tail = [eos_id] if eos_id is not None else []
    out = []
    for ids in ids_list:
        n = len(ids) // passage
        if n == 0:
            out.append(None)
            continue
        doc, cuts = [], []
        for i in range(n):
            p = list(ids[i * passage:(i + 1) * passage])
            doc.extend(p + p + tail)
            cuts.append(len(doc))
        out.append((doc, list(doc), cuts))
    return out


def _check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(f"an SFT example's messages must be a non-empty list of {{role, content}}, got {messages!r:.200}")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise DataError(f"each message needs 'role' and string 'content', got {m!r:.200}")


def encode_chat(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Chat example -> (input_ids, labels) with labels = ids on assistant-answer tokens only.

    The answer of assistant turn i is the text the template adds between rendering
    ``messages[:i]`` with the generation prompt (for a first turn: the generation prompt alone)
    and rendering ``messages[:i+1]`` (its end marker included, trailing whitespace excluded);
    tokens that start inside it are labelled.
    Works for any template whose renderings of prefixes are prefixes of the full rendering.
    """
    _check_messages(messages)
    if getattr(tokenizer, "chat_template", None) is None:
        raise DataError("SFT needs a tokenizer with a chat template (the embedded tokenizer has one)")
    render = lambda msgs, gen=False: tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)  # noqa: E731
    full = render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        upto = render(messages[: i + 1])
        if i:
            prefix = render(messages[:i], True)
        else:  # transformers renders no empty conversation: the answer follows the generation prompt
            gp = _generation_prompt(render)
            prefix = upto[: upto.find(gp) + len(gp)] if gp and gp in upto else None
        if prefix is None or not (full.startswith(upto) and upto.startswith(prefix)):
            raise DataError("the tokenizer's chat template does not render conversations prefix-consistently; "
                            "cannot locate assistant answers")
        spans.append((len(prefix), len(upto.rstrip())))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    labels = [IGNORE] * len(ids)
    for t, (a, b) in enumerate(enc["offset_mapping"]):
        if b > a and any(s <= a < e for s, e in spans):
            labels[t] = ids[t]
    return ids, labels


def _generation_prompt(render) -> str:
    """The text ``add_generation_prompt`` appends to a conversation (its assistant header), or ""."""
    one = [{"role": "user", "content": ""}]
    bare, gen = render(one), render(one, True)
    return gen[len(bare):] if gen.startswith(bare) else ""


def make_encoder(mode: str, tokenizer, data_cfg, seq_len: int) -> Callable[[list[dict]], list]:
    """The encoder of a mode's records; its ``why_empty()`` says which key dropped every record of a
    dataset that produced no tokens (``data.seq_len``, ``data.repeat_passage``), or None."""
    dropped = {"cut": 0, "other": 0}  # records skipped: by the cut to seq_len (sft) / shorter than a passage, or else
    if mode == "sft":
        field = data_cfg.messages_field

        def enc(records):
            out = []
            for r in records:
                if field not in r:
                    raise DataError(f"SFT record has no '{field}' field (fields: {list(r)}); set data.messages_field")
                ids, full = encode_chat(tokenizer, r[field])
                ids, labels = ids[:seq_len], full[:seq_len]
                kept = any(l != IGNORE for l in labels[1:])
                if not kept:
                    dropped["cut" if any(l != IGNORE for l in full[1:]) else "other"] += 1
                out.append((ids, labels) if kept else None)
            return out

        enc.why_empty = lambda: (f"every example's answer starts past its first data.seq_len ({seq_len}) tokens, "
                                 f"where a longer example is cut: raise data.seq_len"
                                 if dropped["cut"] and not dropped["other"] else None)
        return enc
    field = data_cfg.text_field
    eos = tokenizer.eos_token_id
    passage = getattr(data_cfg, "repeat_passage", 0)

    def enc(records):
        if records and field not in records[0]:
            raise DataError(f"record has no '{field}' field (fields: {list(records[0])}); set data.text_field")
        texts = [r[field] for r in records]
        bad = next((t for t in texts if t is not None and not isinstance(t, str)), None)
        if bad is not None:  # a null (a record without the field) is an empty document, skipped
            kind = type(bad).__name__
            raise DataError(f"data.text_field '{field}' holds {'an' if kind[0] in 'aeiou' else 'a'} {kind}, not text: {bad!r:.100}; "
                            f"set data.text_field to a field of strings")
        if passage:
            out = encode_repeat_batch(tokenizer, texts, eos, passage)
            dropped["cut"] += sum(1 for t, e in zip(texts, out) if e is None and t and t.strip())
            return out
        return encode_text_batch(tokenizer, texts, eos)

    enc.why_empty = lambda: (f"every document is shorter than data.repeat_passage ({passage}) tokens, one passage: "
                             f"lower data.repeat_passage" if dropped["cut"] else None)
    return enc


# --------------------------------------------------------------------------- packing


@dataclass
class Row:
    input_ids: list
    labels: list
    seg_lens: list


class PackedStream:
    """Endless, resumable stream of packed rows of exactly ``seq_len`` tokens.

    The encoder maps a list of records to one entry per record: None (skipped), ``(ids,
    labels)`` (one document), or ``(ids, labels, cuts)``: several documents back to back,
    ``cuts`` their end offsets in ``ids``. A piece of a row never crosses a document end;
    with ``split_docs`` false a document that does not fit the rest of a row starts the next
    row (the rest is padded). The state's ``offset`` counts tokens of the record's entry, so
    resuming is exact either way.
    """

    def __init__(self, source: DocSource, encoder, seq_len: int, *, split_docs: bool, pad_id: int,
                 encode_batch: int = 64, max_epochs: Optional[int] = None):
        self.source, self.encoder, self.seq_len = source, encoder, seq_len
        self.split_docs, self.pad_id, self.encode_batch, self.max_epochs = split_docs, pad_id, encode_batch, max_epochs
        self.epoch, self.offset, self.rows = 0, 0, 0
        self._next_fetch = 0
        self._queue: deque = deque()
        self._iter = None
        self._epoch_tokens = 0

    # state ------------------------------------------------------------------
    def state_dict(self) -> dict:
        doc = self._queue[0][0] if self._queue else self._next_fetch
        return {"epoch": self.epoch, "doc": int(doc), "offset": int(self.offset), "rows": int(self.rows)}

    def load_state_dict(self, st: dict) -> None:
        self.epoch, self._next_fetch, self.offset, self.rows = st["epoch"], st["doc"], st["offset"], st["rows"]
        self._queue.clear()
        self._iter = None
        self._epoch_tokens = 1  # the resumed epoch is known not to be empty

    # reading ----------------------------------------------------------------
    def _fill(self) -> None:
        while not self._queue:
            if self._iter is None:
                self._iter = self.source.batches(self.epoch, self._next_fetch, self.encode_batch)
            try:
                batch = next(self._iter)
            except StopIteration:
                if self._epoch_tokens == 0:
                    why = getattr(self.encoder, "why_empty", lambda: None)()
                    raise DataError(f"{self.source.name}: dataset {self.source.spec!r} produced no tokens" +
                                    (f": {why}" if why else " (empty, or every example was empty / had no answer "
                                                            "tokens)")) from None
                self.epoch += 1
                if self.max_epochs is not None and self.epoch >= self.max_epochs:
                    raise StopIteration
                self._next_fetch, self.offset, self._epoch_tokens = 0, 0, 0
                self._iter = None
                continue
            try:
                encoded = self.encoder([r for _, r in batch])
            except DataError:
                for idx, r in batch:  # name the record (its batch encoded one by one, on this path only)
                    try:
                        self.encoder([r])
                    except DataError as e:
                        row = self.source.row(self.epoch, idx)
                        where = (f"row {row}" if row is not None else
                                 f"document {idx} of epoch {self.epoch}'s shuffled stream")
                        raise DataError(f"{self.source.name}, {where} (from 0): {e}") from None
                raise
            for (idx, _), e in zip(batch, encoded):
                if e is not None:
                    cuts = tuple(e[2]) if len(e) > 2 else (len(e[0]),)
                    self._queue.append((idx, e[0], e[1], cuts))
                    self._epoch_tokens += len(e[0])
            self._next_fetch = batch[-1][0] + 1

    def next_row(self) -> Row:
        ids_row, lab_row, segs = [], [], []
        while len(ids_row) < self.seq_len:
            room = self.seq_len - len(ids_row)
            if not self._queue:
                try:
                    self._fill()
                except StopIteration:  # the last pass ended (eval): pad and return what the row holds
                    if not ids_row:
                        raise
                    break
            idx, ids, labels, cuts = self._queue[0]
            end = next((c for c in cuts if c > self.offset), None)
            if end is None:  # a resumed position past this record's end: not the data it was saved on
                raise DataError(f"{self.source.name}: the data position (document {idx} of epoch {self.epoch}, "
                                f"token {self.offset}) is past that document's end ({len(ids)} tokens): the data "
                                f"changed since the checkpoint was saved")
            rem = end - self.offset  # to the end of this document
            if self.split_docs:
                take = min(rem, room)
            else:
                if rem > room:
                    if not ids_row:
                        raise DataError(f"{self.source.name}: a document of {rem} tokens cannot be packed "
                                        f"whole into rows of {self.seq_len} tokens")
                    break  # pad the rest of this row; the example starts the next row
                take = rem
            piece_ids = ids[self.offset:self.offset + take]
            piece_lab = list(labels[self.offset:self.offset + take])
            piece_lab[0] = IGNORE  # nothing before a segment predicts its first token
            ids_row.extend(piece_ids)
            lab_row.extend(piece_lab)
            segs.append(take)
            self.offset += take
            if self.offset >= len(ids):
                self._queue.popleft()
                self.offset = 0
        pad = self.seq_len - len(ids_row)
        if pad:
            ids_row.extend([self.pad_id] * pad)
            lab_row.extend([IGNORE] * pad)
            segs.append(pad)
        self.rows += 1
        return Row(ids_row, lab_row, segs)

    def take(self, n: int) -> list[Row]:
        return [self.next_row() for _ in range(n)]


# --------------------------------------------------------------------------- batches


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [1, N]
    labels: torch.Tensor  # [1, N]
    cu_seqlens: torch.Tensor  # int32 [num_segments + 1]
    seg_lens: list  # python ints, for FLOP counting

    @property
    def num_targets(self) -> int:
        return int((self.labels[:, 1:] != IGNORE).sum())

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device) -> "PackedBatch":
        return PackedBatch(self.input_ids.to(device, non_blocking=True), self.labels.to(device, non_blocking=True),
                           self.cu_seqlens.to(device, non_blocking=True), self.seg_lens)


def collate(rows: list[Row]) -> PackedBatch:
    """Rows -> one packed sequence (B = 1) with ``cu_seqlens`` over every segment of every row."""
    ids = [t for r in rows for t in r.input_ids]
    labels = [t for r in rows for t in r.labels]
    segs = [s for r in rows for s in r.seg_lens]
    cu = np.concatenate([[0], np.cumsum(segs)]).astype(np.int32)
    return PackedBatch(torch.tensor([ids], dtype=torch.long), torch.tensor([labels], dtype=torch.long),
                       torch.from_numpy(cu), segs)


def count_targets(rows: list[Row]) -> int:
    """Scored positions of rows as the model sees them: label t+1 != -100 within each row."""
    return sum(sum(1 for l in r.labels[1:] if l != IGNORE) for r in rows)


# --------------------------------------------------------------------------- builders


def resolve_data_spec(spec, mode: str, which: str):
    from ..data import embedded_paths

    if spec == "embedded":
        train, ev = embedded_paths("sft" if mode == "sft" else "pt")
        return train if which == "train" else ev
    return spec


def build_stream(cfg, tokenizer, which: str = "train") -> Optional[PackedStream]:
    """The train stream (shuffled, endless) or the eval stream (in order, one pass)."""
    d = cfg.data
    spec = d.train if which == "train" else d.eval
    if spec is None:
        return None
    spec = resolve_data_spec(spec, cfg.mode, which)
    src = DocSource(spec, fmt=d.format, streaming=d.streaming, shuffle=d.shuffle and which == "train",
                    seed=cfg.seed, shuffle_buffer=d.shuffle_buffer, text_sample_by=d.text_sample_by,
                    name=f"data.{which}")
    src.check_column(*((d.messages_field, "data.messages_field") if cfg.mode == "sft" else
                       (d.text_field, "data.text_field")))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    enc = make_encoder(cfg.mode, tokenizer, d, d.seq_len)
    whole = cfg.mode == "sft" or d.repeat_passage > 0  # chat examples and P P EOS units are never split
    return PackedStream(src, enc, d.seq_len, split_docs=not whole, pad_id=pad,
                        encode_batch=d.encode_batch, max_epochs=None if which == "train" else 1)


def eval_rows(stream: PackedStream, n: int) -> list[Row]:
    rows = []
    try:
        for _ in range(n):
            rows.append(stream.next_row())
    except StopIteration:
        pass
    return rows


__all__ = ["DataError", "DocSource", "PackedStream", "PackedBatch", "Row", "collate", "count_targets",
           "encode_chat", "encode_repeat_batch", "encode_text_batch", "build_stream", "eval_rows", "IGNORE", "ConfigError"]
