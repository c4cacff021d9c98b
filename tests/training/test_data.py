"""Data pipeline: packing respects documents, SFT labels only answers, exact resume, bad data."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# `datasets` reads the training data; it must be a dependency of the package (pyproject).
pytest.importorskip("datasets", reason="training needs the `datasets` package")

from orthros.data import CORPUS_TRAIN, SFT_TRAIN, load_tokenizer
from orthros.training.config import load_config
from orthros.training.data import (IGNORE, DataError, DocSource, PackedStream, build_stream, collate,
                                   count_targets, encode_chat)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


class ListSource:
    """A DocSource stand-in: documents are given token lists (the encoder passes them through)."""

    name, spec = "data.train", "list"

    def __init__(self, docs):
        self.docs = docs

    def batches(self, epoch, start, batch):
        for i in range(start, len(self.docs), batch):
            yield [(j, self.docs[j]) for j in range(i, min(i + batch, len(self.docs)))]


def _passthrough(records):
    return [(list(r), list(r)) if r else None for r in records]


def _check_rows(rows, seq_len):
    for r in rows:
        assert len(r.input_ids) == len(r.labels) == seq_len == sum(r.seg_lens)
        starts = [0]
        for s in r.seg_lens[:-1]:
            starts.append(starts[-1] + s)
        seg_of = [i for i, s in enumerate(r.seg_lens) for _ in range(s)]
        for s in starts:
            assert r.labels[s] == IGNORE  # nothing predicts the first token of a segment
        for t in range(seq_len - 1):  # every scored position predicts a token of its own segment
            if r.labels[t + 1] != IGNORE:
                assert seg_of[t] == seg_of[t + 1]


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(0, 40), min_size=1, max_size=12), seq_len=st.integers(1, 33),
       split=st.booleans(), n_rows=st.integers(1, 12))
def test_packing_invariants(lens, seq_len, split, n_rows):
    docs = [[1000 * (d + 1) + k for k in range(n)] for d, n in enumerate(lens)]
    if sum(lens) == 0:
        with pytest.raises(DataError, match="produced no tokens"):
            PackedStream(ListSource(docs), _passthrough, seq_len, split_docs=True, pad_id=-1).next_row()
        return
    if not split:
        docs = [d[:seq_len] for d in docs]
    s = PackedStream(ListSource(docs), _passthrough, seq_len, split_docs=split, pad_id=-1, encode_batch=3)
    rows = s.take(n_rows)
    _check_rows(rows, seq_len)
    for r in rows:  # a segment holds tokens of one document only, in order
        off = 0
        for n in r.seg_lens:
            seg = r.input_ids[off:off + n]
            off += n
            if seg[0] == -1:
                assert set(seg) == {-1} and not split
                continue
            assert len({t // 1000 for t in seg}) == 1 and seg == list(range(seg[0], seg[0] + n))
    # PT: the concatenation of rows is the concatenation of documents, cycling over epochs
    if split:
        flat = [t for r in rows for t in r.input_ids]
        stream = [t for d in docs for t in d] * (len(flat) // max(1, sum(lens)) + 2)
        assert flat == stream[:len(flat)]
    # resume: a fresh stream loaded with the state continues identically
    st_ = s.state_dict()
    more = s.take(3)
    s2 = PackedStream(ListSource(docs), _passthrough, seq_len, split_docs=split, pad_id=-1, encode_batch=5)
    s2.load_state_dict(st_)
    assert [r.input_ids for r in s2.take(3)] == [r.input_ids for r in more]


def test_collate_cu_seqlens_spans_all_rows():
    docs = [[1] * 5, [2] * 9, [3] * 4]
    rows = PackedStream(ListSource(docs), _passthrough, 6, split_docs=True, pad_id=0).take(3)
    b = collate(rows)
    assert b.input_ids.shape == (1, 18)
    assert b.cu_seqlens.tolist() == [0, 5, 6, 12, 14, 18]
    assert b.num_targets == count_targets(rows) == 18 - 5


def test_sft_labels_are_exactly_the_answers(tok):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Who is the Prince of Denmark?"},
            {"role": "assistant", "content": "Hamlet, son of the late king."},
            {"role": "user", "content": "And his mother?"},
            {"role": "assistant", "content": "Gertrude"}]
    ids, labels = encode_chat(tok, msgs)
    assert ids == tok.apply_chat_template(msgs, tokenize=True, return_dict=False) or \
        ids == tok(tok.apply_chat_template(msgs, tokenize=False), add_special_tokens=False)["input_ids"]
    # token by token: labelled tokens are the assistant answers + their end marker, nothing else
    runs, cur = [], []
    for i, l in zip(ids, labels):
        if l != IGNORE:
            assert l == i
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    assert [tok.decode(r) for r in runs] == ["Hamlet, son of the late king.<|im_end|>", "Gertrude<|im_end|>"]
    # the same mask as the template's own {% generation %} markers
    ref = tok.apply_chat_template(msgs, return_assistant_tokens_mask=True, return_dict=True)
    assert ref["input_ids"] == ids
    assert [int(l != IGNORE) for l in labels] == ref["assistant_masks"]


def test_sft_rows_from_embedded_sample(tok):
    cfg = load_config(None, ["--mode", "sft", "--seq_len", "96", "--encode_batch", "8"])
    s = build_stream(cfg, tok)
    rows = s.take(6)
    _check_rows(rows, 96)
    records = [json.loads(l) for l in open(SFT_TRAIN)]
    answers = {m["content"] + "<|im_end|>" for r in records for m in r["messages"] if m["role"] == "assistant"}
    for r in rows:
        off = 0
        for n in r.seg_lens:
            lab = r.labels[off:off + n]
            off += n
            text = "".join(tok.decode([l]) for l in lab if l != IGNORE)
            if r.input_ids[off - n] == tok.pad_token_id:
                assert text == ""
                continue
            assert text and "<|im_start|>" not in text and "user\n" not in text
            if n < 96:  # not truncated: every answer is complete and is one of the sample's answers
                runs, cur = [], []
                for l in lab + [IGNORE]:
                    if l != IGNORE:
                        cur.append(l)
                    elif cur:
                        runs.append(tok.decode(cur))
                        cur = []
                assert runs and all(a in answers for a in runs)


def _write_jsonl(path, texts):
    with open(path, "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")


@pytest.mark.parametrize("streaming", [False, True])
def test_local_jsonl_stream_resumes_exactly(tmp_path, tok, streaming):
    texts = [json.loads(l)["text"][:300] for _, l in zip(range(30), open(CORPUS_TRAIN))]
    _write_jsonl(tmp_path / "d.jsonl", texts)
    cfg = load_config(None, ["--data.train", str(tmp_path / "d.jsonl"), "--seq_len", "40",
                             "--data.streaming", str(streaming).lower(), "--encode_batch", "4", "--shuffle_buffer", "8"])
    s = build_stream(cfg, tok)
    s.take(100)  # crosses an epoch boundary (30 docs * ~110 tokens / 40 per row)
    state = s.state_dict()
    after = [r.input_ids for r in s.take(40)]
    s2 = build_stream(cfg, tok)
    s2.load_state_dict(state)
    assert [r.input_ids for r in s2.take(40)] == after
    assert s.epoch >= 1


def test_text_and_parquet_sources(tmp_path, tok):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("To be, or not to be.\n\nThat is the question.\n")
    src = DocSource(str(tmp_path / "a.txt"), text_sample_by="paragraph")
    assert src.num_docs == 2
    pq.write_table(pa.table({"content": ["Once more unto the breach", "dear friends"]}), tmp_path / "b.parquet")
    cfg = load_config(None, ["--data.train", str(tmp_path / "b.parquet"), "--text_field", "content", "--seq_len", "8"])
    rows = build_stream(cfg, tok).take(2)
    assert tok.decode(rows[0].input_ids).startswith("Once more")
    cfg = load_config(None, ["--data.train", str(tmp_path / "b.parquet"), "--seq_len", "8"])
    with pytest.raises(DataError, match="no column 'text'.*content"):
        build_stream(cfg, tok)


def test_empty_or_missing_data_is_a_clear_error(tmp_path, tok):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="empty|no tokens|could not load"):
        s = build_stream(load_config(None, ["--data.train", str(tmp_path / "empty.jsonl")]), tok)
        s.next_row()
    _write_jsonl(tmp_path / "blank.jsonl", ["", ""])
    with pytest.raises(DataError, match="produced no tokens"):
        build_stream(load_config(None, ["--data.train", str(tmp_path / "blank.jsonl")]), tok).next_row()
    with pytest.raises(DataError, match="not found"):
        build_stream(load_config(None, ["--data.train", str(tmp_path / "nope.jsonl")]), tok)


def test_sft_assistant_first_turn_trains_no_role_header(tok):
    """A conversation that opens with the assistant: only its answer is labelled, not the
    ``<|im_start|>assistant`` header before it (transformers renders no empty conversation, so
    the header was once taken for part of the answer)."""
    msgs = [{"role": "assistant", "content": "Good morrow."}, {"role": "user", "content": "Hail!"},
            {"role": "assistant", "content": "Well met."}]
    ids, labels = encode_chat(tok, msgs)
    ref = tok.apply_chat_template(msgs, return_assistant_tokens_mask=True, return_dict=True)
    assert ref["input_ids"] == ids
    assert [int(l != IGNORE) for l in labels] == ref["assistant_masks"]


@pytest.mark.parametrize("value", [7, ["To be", "or not"], {"line": "To be"}])
def test_text_field_that_is_not_text_is_refused(tmp_path, tok, value):
    """A data.text_field holding numbers, lists or objects (a wrong field) is refused naming the
    field and what it holds; it was read as empty text: skipped, or 'produced no tokens'."""
    with open(tmp_path / "d.jsonl", "w") as f:
        f.write(json.dumps({"text": "Once more unto the breach", "body": value}) + "\n")
    cfg = load_config(None, ["--data.train", str(tmp_path / "d.jsonl"), "--text_field", "body", "--seq_len", "8"])
    kind = type(value).__name__  # "an int" (was "a int"), "a list"
    with pytest.raises(DataError, match=f"data.text_field 'body' holds {'an' if kind == 'int' else 'a'} {kind}, not text"):
        build_stream(cfg, tok).next_row()
    # a null (a record without the field) is still an empty document, skipped
    with open(tmp_path / "n.jsonl", "w") as f:
        f.write(json.dumps({"text": "Once more"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    n = len(tok("Once more", add_special_tokens=False)["input_ids"]) + 1
    rows = build_stream(load_config(None, ["--data.train", str(tmp_path / "n.jsonl"), "--seq_len", str(n)]), tok).take(2)
    assert [tok.decode(r.input_ids) for r in rows] == ["Once more<|endoftext|>"] * 2


def test_unreadable_json_names_the_parse_error(tmp_path, tok):
    """A JSON lines file that does not parse: the error says why (datasets' own error is a
    generic 'An error occurred while generating the dataset'; the reason is its cause)."""
    (tmp_path / "d.jsonl").write_text('{"text": "To be"}\n{"text": "or not"\n')
    with pytest.raises(DataError, match=r"could not load files .*d.jsonl.*JSON parse error"):
        build_stream(load_config(None, ["--data.train", str(tmp_path / "d.jsonl")]), tok)


def test_files_of_other_columns_are_one_line(tmp_path, tok):
    """JSON lines files of different columns: datasets' reason ran to a dozen lines (its CastError
    lists both schemas), where a data error is one line."""
    (tmp_path / "a.jsonl").write_text('{"text": "To be"}\n' * 3)
    (tmp_path / "b.jsonl").write_text('{"prompt": "or not", "completion": "to be", "id": 3}\n' * 3)
    with pytest.raises(DataError) as e:
        build_stream(load_config(None, ["--data.train", str(tmp_path / "*.jsonl")]), tok)
    assert "could not load files" in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_glob_skips_the_directories_it_matches(tmp_path, tok):
    """``data/*`` over a folder that also holds a subfolder reads the files (datasets was handed
    the subfolder too and failed: 'Unable to find ...')."""
    _write_jsonl(tmp_path / "a.jsonl", ["Once more unto the breach"])
    (tmp_path / "sub").mkdir()
    rows = build_stream(load_config(None, ["--data.train", str(tmp_path / "*"), "--seq_len", "4"]), tok).take(1)
    assert tok.decode(rows[0].input_ids).startswith("Once")
    with pytest.raises(DataError, match="matches no file"):
        build_stream(load_config(None, ["--data.train", str(tmp_path / "s*")]), tok)


@pytest.mark.parametrize("which", ["train", "eval"])
def test_missing_data_names_its_key(tmp_path, tok, which):
    """A data file, glob or folder that is not there was refused without the key that named it
    ('data file not found: ...'), where data.train and data.eval may both be set."""
    (tmp_path / "empty").mkdir()
    for spec, what in ((tmp_path / "none.jsonl", "data file not found"), (tmp_path / "n*.jsonl", "matches no file"),
                       (tmp_path / "empty", "holds no")):
        with pytest.raises(DataError, match=f"^data.{which}: .*{what}"):
            build_stream(load_config(None, [f"--data.{which}", str(spec)]), tok, which)


def test_eval_stream_scores_its_last_partial_row(tmp_path, tok):
    """The held-out data's tail that does not fill a row is padded and scored: a held-out set
    shorter than seq_len gave no eval sequence at all, and a longer one lost its tail."""
    from orthros.training.data import eval_rows

    text = "To be, or not to be, that is the question."
    n = len(tok(text, add_special_tokens=False)["input_ids"]) + 1  # + EOS
    _write_jsonl(tmp_path / "ev.jsonl", [text])
    for seq_len in (n + 5, n - 3):
        cfg = load_config(None, ["--data.eval", str(tmp_path / "ev.jsonl"), "--seq_len", str(seq_len)])
        rows = eval_rows(build_stream(cfg, tok, "eval"), 32)
        _check_rows(rows, seq_len)
        assert tok.decode([t for r in rows for t in r.input_ids][:n]) == text + "<|endoftext|>"
        assert count_targets(rows) == n - 1 - (seq_len < n)  # every token but each piece's first
        assert rows[-1].seg_lens[-1] == len(rows) * seq_len - n  # the pad


def test_files_of_several_formats_are_refused_as_such(tmp_path, tok):
    """A .txt and a .jsonl in one data.train: the error said 'cannot tell the format (set
    data.format)', but no one format reads both."""
    (tmp_path / "a.txt").write_text("To be.\n")
    _write_jsonl(tmp_path / "b.jsonl", ["Or not."])
    with pytest.raises(DataError, match=r"several formats \(json, text\)"):
        DocSource([str(tmp_path / "a.txt"), str(tmp_path / "b.jsonl")])


def test_a_bad_record_is_named_by_its_row(tmp_path, tok):
    """A bad record past the first ones was reported without saying where it is (in a large file:
    'each message needs role and string content, got {...}' and no more)."""
    good = {"messages": [{"role": "user", "content": "Hail!"}, {"role": "assistant", "content": "Well met."}]}
    rows = [good] * 7 + [{"messages": [{"role": "user"}]}] + [good] * 2
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for shuffle in ("false", "true"):
        cfg = load_config(None, ["--mode", "sft", "--data.train", str(tmp_path / "c.jsonl"), "--seq_len", "64",
                                 "--encode_batch", "3", "--data.shuffle", shuffle])
        with pytest.raises(DataError, match=r"^data.train, row 7 \(from 0\): each message needs 'role' and string "
                                            r"'content', got \{'role': 'user'\}"):
            build_stream(cfg, tok).take(len(rows))


def test_a_position_past_a_documents_end_is_a_clear_error():
    """A resumed data position on data that changed since (a file edited in place) failed with a
    bare StopIteration."""
    s = PackedStream(ListSource([[1, 2, 3], [4, 5]]), _passthrough, 4, split_docs=True, pad_id=0)
    s.load_state_dict({"epoch": 0, "doc": 1, "offset": 7, "rows": 3})
    with pytest.raises(DataError, match=r"^data.train: the data position \(document 1 of epoch 0, token 7\) is past "
                                        r"that document's end \(2 tokens\): the data changed since"):
        s.next_row()


@pytest.mark.parametrize("name", ["e.jsonl", "e.csv", "e.parquet"])
def test_empty_files_are_said_to_be_empty(tmp_path, name):
    """Files of 0 bytes were 'could not load files [...]: StopIteration: ' (JSON lines), a CSV or
    Parquet parser's error: said to be empty, as an empty dataset is."""
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(DataError, match=rf"^data.train: {tmp_path / name} is empty \(0 bytes\)"):
        DocSource(str(tmp_path / name))
    (tmp_path / f"2{name}").write_bytes(b"")
    with pytest.raises(DataError, match=r"^data.eval: every file of .* is empty \(0 bytes\)"):
        DocSource(str(tmp_path / "*"), name="data.eval")


def test_a_dataset_folder_with_its_card_reads_the_data(tmp_path, tok):
    """A dataset folder as the hub lays it out (README.md, the dataset card, beside the data files)
    was refused as 'files of several formats (json, text)': the card is not a document. A folder of
    text files keeps its .md files, and a README.md named on its own is read."""
    d = tmp_path / "ds"
    d.mkdir()
    (d / "README.md").write_text("---\nlicense: mit\n---\n# A card\n")
    _write_jsonl(d / "train.jsonl", ["Once more unto the breach"])
    src = DocSource(str(d))
    assert src.builder == "json" and src.num_docs == 1
    (d / "train.jsonl").unlink()
    (d / "more.txt").write_text("To be.\n")
    assert DocSource(str(d)).num_docs == 2  # README.md and more.txt: text files both, both read
    assert DocSource(str(d / "README.md")).builder == "text"


def test_a_data_path_under_the_home_folder_of_no_user_is_named(tmp_path, monkeypatch):
    """os.path.expanduser keeps `~nosuchuser9/x.txt` as typed: the run said 'data file not found:
    ~nosuchuser9/x.txt', as if the user existed and lacked the file."""
    from orthros.training.data import _resolve_files

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "d.txt").write_text("hello\n")
    assert _resolve_files("~/d.txt") == [str(tmp_path / "d.txt")]
    with pytest.raises(DataError, match=r"^data.eval ~nosuchuser9/x.txt: no user 'nosuchuser9' on this machine"):
        _resolve_files(["~/d.txt", "~nosuchuser9/x.txt"], "data.eval")


@pytest.mark.parametrize("which", ["train", "eval"])
def test_a_missing_data_file_named_without_a_folder_is_not_a_hub_name(tmp_path, tok, monkeypatch, which):
    """`--data.train train.jsonl` run from the wrong folder was taken for a hub dataset: 'not a local
    path ... the hub is unreachable' offline, the hub client's error online. A name with a data file's
    extension is a file: 'data file not found', with the folder it was looked for in."""
    monkeypatch.chdir(tmp_path)
    for name in ("train.jsonl", "corpus.txt.gz"):
        with pytest.raises(DataError, match=f"^data.{which}: data file not found: {name} "
                                            rf"\(looked for in {tmp_path}\)"):
            build_stream(load_config(None, [f"--data.{which}", name]), tok, which)


@pytest.mark.parametrize("name", ["tokens.npy", "train.bin"])
def test_a_file_of_no_data_format_names_the_formats(tmp_path, tok, name):
    """A pre-tokenized file (.npy / .bin) was told to 'set data.format', which has no format for it."""
    p = tmp_path / name
    p.write_bytes(b"\x00\x01" * 64)
    with pytest.raises(DataError, match=rf"^data.train: cannot tell the format of {p} from its extension: data files "
                                        rf"are text \(\.txt, \.text, \.md\), json \(\.json, \.jsonl\), parquet, csv "
                                        rf"or arrow \(compressed too\); token files are not read; data.format names "
                                        rf"the format of a file of another extension"):
        build_stream(load_config(None, ["--data.train", str(p)]), tok)


@pytest.mark.parametrize("mode,key", [("pt", "data.text_field"), ("sft", "data.messages_field")])
def test_a_missing_column_names_the_key_the_mode_reads(tmp_path, tok, mode, key):
    """'set data.text_field / data.messages_field' named both keys, one of which the mode refuses when set."""
    _write_jsonl(tmp_path / "a.jsonl", ["x"])  # a 'text' column
    column = "body" if mode == "pt" else "messages"
    cfg = load_config(None, ["--mode", mode, "--data.train", str(tmp_path / "a.jsonl"), "--data.eval", "null",
                             f"--{key}", column])
    with pytest.raises(DataError, match=rf"^data.train: dataset has no column '{column}' \(columns: \['text'\]\); "
                                        rf"set {key} to one of them$"):
        build_stream(cfg, tok)


def test_data_too_short_for_its_rows_says_which_key_to_change(tmp_path, tok):
    """SFT examples cut to data.seq_len before their answer, and documents shorter than
    data.repeat_passage, were 'produced no tokens (empty, or every example was empty ...)': neither
    is empty, and the key that drops them went unnamed."""
    cfg = load_config(None, ["--mode", "sft", "--seq_len", "8", "--data.eval", "null"])
    with pytest.raises(DataError, match=r"^data.train: dataset .* produced no tokens: every example's answer starts "
                                        r"past its first data.seq_len \(8\) tokens, where a longer example is cut: "
                                        r"raise data.seq_len$"):
        build_stream(cfg, tok).take(1)
    (tmp_path / "a.txt").write_text("To be, or not to be.")
    cfg = load_config(None, ["--data.train", str(tmp_path / "a.txt"), "--data.eval", "null",
                             "--data.repeat_passage", "100"])
    with pytest.raises(DataError, match=r"^data.train: dataset .* produced no tokens: every document is shorter than "
                                        r"data.repeat_passage \(100\) tokens, one passage: lower data.repeat_passage$"):
        build_stream(cfg, tok).take(1)


@pytest.mark.parametrize("name,text", [("a.jsonl", "\n\n"), ("a.json", "[]"), ("a.csv", "text\n")])
def test_a_data_file_of_no_records_is_called_empty(tmp_path, tok, name, text):
    """A file of bytes but no record (blank lines, [], a CSV header) was datasets' 'Instruction "train"
    corresponds to no data!', behind 'could not load'."""
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(DataError, match=rf"^data.train: {re.escape(str(p))} holds no records \(0 rows\)$"):
        build_stream(load_config(None, ["--data.train", str(p), "--data.eval", "null"]), tok)


def test_several_files_not_written_as_a_list_are_told_how(tmp_path, tok):
    """'a.txt,b.txt' (or with a space) was 'data file not found: a.txt,b.txt'; two values after one
    override were 'expected an override, got b.txt'."""
    from orthros.training.config import ConfigError

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    for sep in (",", " ", ", "):
        with pytest.raises(DataError, match=re.escape(f"data.train: data file not found: {a}{sep}{b} (several are a "
                                                      f"list: [{a}, {b}])")):
            build_stream(load_config(None, ["--data.train", f"{a}{sep}{b}"]), tok)
    with pytest.raises(ConfigError, match=re.escape(f"got '{b}' (an override takes one value; several are a list: "
                                                    f"--data.train '[{a}, {b}]')")):
        load_config(None, ["--data.train", str(a), str(b)])
