"""Long-range data option (``data.repeat_passage``): documents ``P P EOS`` with the repeat
structure intact, packed whole inside one ``cu_seqlens`` segment, resumable exactly, the eval
set built the same way, bad values refused; and the premise of configs/tiny_cpu_longrange.yaml
(a sliding-window model of L layers cannot see further back than L * (w - 1) tokens)."""

import json

import pytest
import torch

pytest.importorskip("datasets", reason="training needs the `datasets` package")

import orthros  # noqa: F401
from orthros.data import CORPUS_EVAL, CORPUS_TRAIN, load_tokenizer
from orthros.training.cli import main as cli_main
from orthros.training.config import ConfigError, load_config
from orthros.training.data import IGNORE, build_stream, collate, encode_repeat_batch
from test_trainer import replaced  # noqa: E402  (a key of the test's own replaces the base's)

N, SEQ = 20, 64  # passage tokens, row length: a unit is 2N+1 = 41 tokens, one per row


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """12 documents of varied length cut from the embedded corpus; one shorter than N tokens."""
    p = tmp_path_factory.mktemp("lr") / "docs.jsonl"
    with open(CORPUS_TRAIN) as f, open(p, "w") as out:
        for i, line in zip(range(12), f):
            text = json.loads(line)["text"]
            out.write(json.dumps({"text": text[:20] if i == 3 else text[300:300 + 150 + 37 * i]}) + "\n")
    return str(p)


def cfg_for(corpus, *extra):
    """The config of these tests; a key of ``extra`` replaces theirs (an override given twice is refused)."""
    return load_config(None, replaced(["--data.train", corpus, "--data.eval", corpus, "--seq_len", str(SEQ),
                                       "--data.repeat_passage", str(N), "--shuffle", "false"], *extra))


def units_of(row):
    """(ids, labels) of each segment of a row, pad segment excluded."""
    out, s = [], 0
    for n in row.seg_lens:
        out.append((row.input_ids[s:s + n], row.labels[s:s + n]))
        s += n
    return out


def test_units_are_p_p_eos_in_document_order(corpus, tok):
    stream = build_stream(cfg_for(corpus), tok, "train")
    docs = [json.loads(l)["text"] for l in open(corpus)]
    expect = []  # every full passage of every document, in order; short tails / docs dropped
    for d in docs:
        ids = tok(d, add_special_tokens=False)["input_ids"]
        expect += [ids[i:i + N] for i in range(0, len(ids) - N + 1, N)]
    assert len(tok(docs[3], add_special_tokens=False)["input_ids"]) < N  # that one yields nothing
    got = []
    rows = stream.take(len(expect))
    for row in rows:
        assert len(row.input_ids) == SEQ and sum(row.seg_lens) == SEQ
        (ids, labels), *rest = units_of(row)
        assert len(ids) == 2 * N + 1 and ids[:N] == ids[N:2 * N] and ids[-1] == tok.eos_token_id
        assert labels[0] == IGNORE and labels[1:] == ids[1:]  # everything but the first token scored
        for pad_ids, pad_labels in rest:  # the rest of the row is padding, never scored
            assert set(pad_labels) == {IGNORE} and set(pad_ids) == {tok.pad_token_id}
        got.append(ids[:N])
    assert got == expect


def test_units_stay_whole_in_one_cu_seqlens_segment(corpus, tok):
    """Two units per row: each is a segment of its own (RoPE restarts, no attention across)."""
    stream = build_stream(cfg_for(corpus, "--seq_len", "100"), tok, "train")
    for row in stream.take(6):
        b = collate([row])
        cu = b.cu_seqlens.tolist()
        assert cu == [0, 41, 82, 100]
        for s, e in zip(cu[:2], cu[1:3]):
            ids = b.input_ids[0, s:e].tolist()
            assert ids[:N] == ids[N:2 * N] and ids[-1] == tok.eos_token_id
            assert int(b.labels[0, s]) == IGNORE
        assert (b.labels[0, 82:] == IGNORE).all()


def test_encode_repeat_batch_cuts():
    class Tok:
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [list(range(len(t))) for t in texts]}

    out = encode_repeat_batch(Tok(), ["abcdefg", "ab", 3], eos_id=99, passage=3)
    ids, labels, cuts = out[0]
    assert ids == [0, 1, 2, 0, 1, 2, 99, 3, 4, 5, 3, 4, 5, 99] and labels == ids and cuts == [7, 14]
    assert out[1] is None and out[2] is None  # shorter than a passage; not a string


def test_resume_mid_stream_is_exact(corpus, tok):
    cfg = cfg_for(corpus, "--seq_len", "100", "--shuffle", "true")
    a = build_stream(cfg, tok, "train")
    a.take(5)
    st = a.state_dict()
    b = build_stream(cfg, tok, "train")
    b.load_state_dict(st)
    assert [r.input_ids for r in a.take(12)] == [r.input_ids for r in b.take(12)]  # crosses an epoch too


def test_eval_set_is_built_the_same_way_from_the_held_out_plays(tok):
    cfg = load_config(None, ["--data.repeat_passage", "127", "--eval_sequences", "4"])
    stream = build_stream(cfg, tok, "eval")
    assert stream.source.spec == str(CORPUS_EVAL)
    first = tok(json.loads(open(CORPUS_EVAL).readline())["text"], add_special_tokens=False)["input_ids"]
    for i, row in enumerate(stream.take(4)):
        ids = units_of(row)[0][0]
        assert len(ids) == 255 and ids[:127] == ids[127:254] == first[127 * i:127 * (i + 1)]


@pytest.mark.parametrize("args,msg", [
    (["--data.repeat_passage", "-1"], r"data.repeat_passage must be 0 \(off\) or .* i.e. 1..127, got -1"),
    (["--data.repeat_passage", "128"], r"2\*N\+1 <= data.seq_len \(256\), i.e. 1..127, got 128"),
    (["--data.repeat_passage", "40", "--seq_len", "64"], r"i.e. 1..31, got 40"),
    (["--data.repeat_passage", "ten"], "config key 'data.repeat_passage' expects int"),
    (["--mode", "sft", "--data.repeat_passage", "8"], r"applies to modes \['pt', 'cpt'\]"),
    (["--data.repeat_pasage", "8"], "unknown config key 'data.repeat_pasage'; did you mean 'data.repeat_passage'"),
])
def test_bad_values_are_refused(args, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(None, args)


def test_yaml_typo_names_the_key_and_the_shipped_config_loads(tmp_path, capsys):
    p = tmp_path / "c.yaml"
    p.write_text("data:\n  repeat_passages: 8\n")
    with pytest.raises(ConfigError, match="did you mean 'data.repeat_passage'"):
        load_config(str(p))
    cfg = load_config("configs/tiny_cpu_longrange.yaml")
    assert cfg.data.repeat_passage == 127 and cfg.model.window_size == 32 and cfg.model.num_hidden_layers == 4
    assert cli_main(["--help-config"]) == 0 and "data.repeat_passage = 0" in capsys.readouterr().out


@pytest.mark.parametrize("mode,blind", [("window", True), ("orthros", False), ("full", False)])
def test_window_model_cannot_see_the_first_copy(mode, blind):
    """The premise of tiny_cpu_longrange.yaml at small scale: 2 layers, window 4 reach 2*3 = 6
    tokens back. With passage 8, the logits of the second copy do not depend on the first copy
    for SWA; they do for Orthros (output stream) and full attention."""
    from orthros.models import OrthrosConfig, OrthrosForCausalLM

    torch.manual_seed(0)
    model = OrthrosForCausalLM(OrthrosConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=2, window_size=4,
                                             attention_mode=mode, use_cache=False)).eval()
    p = torch.randint(0, 64, (8,))
    x = torch.cat([p, p]).unsqueeze(0)
    y = x.clone()
    y[0, 0] = (y[0, 0] + 1) % 64  # change the first token of the first copy
    with torch.no_grad():
        # positions >= 7 lie more than 2 * 3 = 6 tokens after position 0
        a = model(input_ids=x).logits[0, 7:]
        b = model(input_ids=y).logits[0, 7:]
    assert torch.equal(a, b) if blind else not torch.allclose(a, b)
