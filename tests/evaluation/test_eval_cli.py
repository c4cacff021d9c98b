"""`orthros eval ...`: what every sub-command shares (its --help names each default; no option takes an empty value)."""

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


@pytest.mark.parametrize("args, says", [
    # the results written nowhere after the whole run (exit 0)
    # (named as typed: -o, or --output)
    (["mqar", "-o", ""], "-o is empty (''): give a value, or leave the option out for its default"),
    (["mqar", "--output", ""], "--output is empty (''): give a value, or leave the option out for its default"),
    (["ppl", "--model", "{ck}", "--data", "{data}", "-o", " "], "-o is empty (' ')"),
    (["lm", "--model", "{ck}", "--tasks", "orthros_tiny_cloze", "-o", ""], "-o is empty ('')"),
    # the results written into the current folder
    (["niah", "--model", "{ck}", "-o", ""], "-o is empty ('')"),
    (["niah", "--model", "{ck}", "--output-dir", ""], "--output-dir is empty ('')"),
    # the current folder replaced by the checkpoint (its files deleted)
    (["niah-train", "--out", "", "--overwrite"], "--out is empty (''): give a value"),
    # the default device, or the model's own tokenizer, taken silently
    (["ppl", "--model", "{ck}", "--data", "{data}", "--device", ""], "--device is empty ('')"),
    (["niah", "--model", "{ck}", "--tokenizer", ""], "--tokenizer is empty ('')"),
    (["lm", "--model", "{ck}", "--tasks", "orthros_tiny_cloze", "--include-path", ""], "--include-path is empty"),
    (["lm", "--model", "{ck}", "--tasks", "orthros_tiny_cloze", "--include_path", ""], "--include_path is empty"),
])
def test_an_empty_value_is_refused_before_any_work(tmp_path, capsys, monkeypatch, args, says):
    """Issue: an empty value (an unset shell variable: `-o "$OUT"`) was taken as the option not given, or as
    the current folder: `eval niah-train --out "" --overwrite` replaced the folder the command ran in."""
    import orthros.evaluation.cli as cli

    for name in ("_mqar", "_niah", "_niah_train", "_lm", "_ppl"):
        monkeypatch.setattr(cli, name, lambda a: pytest.fail("the command ran"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("keep")
    args = [x.format(ck=tmp_path / "ck", data=tmp_path / "d.txt") for x in args]
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert says in err and out == ""
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_niah_train_refuses_an_empty_out_in_the_python_api_and_module_cli(tmp_path, capsys, monkeypatch):
    from orthros.evaluation import niah_train as nt

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("keep")
    monkeypatch.setattr(nt, "build_model", lambda *a, **kw: pytest.fail("the model was built"))
    with pytest.raises(ValueError, match=r"--out is empty \(''\)"):
        nt.train(nt.NIAHTrainConfig(steps=1), out_dir="", overwrite=True)
    assert nt.main(["--out", " ", "--overwrite"]) == 2
    assert "--out is empty (' ')" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


# `eval ppl | niah | lm` with a --model that reads as a checkpoint (read_config reads only its config.json)
_TOKENIZER_RUNS = {"ppl": ["--data", "{tmp}/d.txt"], "niah": ["-o", "{tmp}/out"],
                   "lm": ["--tasks", "orthros_tiny_cloze", "-o", "{tmp}/lm.json"]}


@pytest.mark.parametrize("what", sorted(_TOKENIZER_RUNS))
@pytest.mark.parametrize("tokenizer, says", [
    ("{tmp}/empty", "--tokenizer {tmp}/empty: no tokenizer files (tokenizer.json"),
    ("{tmp}/nowhere", "--tokenizer {tmp}/nowhere: no such directory"),
    ("{tmp}/d.txt", "--tokenizer {tmp}/d.txt: a file; --tokenizer takes the directory that holds the tokenizer's"),
    (None, "--model {tmp}/ck: no tokenizer files (tokenizer.json"),  # the model's own folder, holding none
])
def test_a_tokenizer_folder_without_a_tokenizer_is_refused_before_torch_loads(tmp_path, what, tokenizer, says):
    """Issue: `eval ppl | niah | lm --tokenizer DIR` with DIR empty (or --model's folder holding no tokenizer) was
    refused only once torch and transformers had loaded (6 s, the time of `load_tokenizer`); `orthros generate`
    refuses it at once (checkpoint_files.check_tokenizer_dir), and so do the evaluations now, in its words."""
    import json
    import subprocess
    import sys

    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(json.dumps({"model_type": "orthros", "max_position_embeddings": 2048,
                                                             "window_size": 16, "vocab_size": 300}))
    (tmp_path / "empty").mkdir()
    (tmp_path / "d.txt").write_text("some held-out text\n")
    fill = lambda t: t.replace("{tmp}", str(tmp_path))  # noqa: E731
    args = [what, "--model", fill("{tmp}/ck"), *map(fill, _TOKENIZER_RUNS[what])]
    if tokenizer is not None:
        args += ["--tokenizer", fill(tokenizer)]
    code = ("import sys\nfrom orthros.evaluation.cli import main\nrc = main(sys.argv[1:])\n"
            "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert f"orthros eval {what}: error: {fill(says)}" in r.stderr, r.stderr
    assert r.stdout.split() == ["2", "False", "False"], (r.stdout, r.stderr)  # (rc, torch and transformers loaded)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "d.txt", "empty"]  # no output written
