"""``orthros generate`` on bad input: one clear line on stderr naming the problem, exit code 2,
nothing written, no traceback and no hub lookup. Also the position limit (prompt longer than
``max_position_embeddings``) across the CLI and the engine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from orthros.cli import main as orthros_main
from orthros.evaluation.common import make_tiny_checkpoint

MPE = 64  # max_position_embeddings of the test checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gen") / "ckpt", max_position_embeddings=MPE)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    import socket

    def refuse(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def listing(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*"))


def refused(argv, capsys, *needles, cwd=None, code=2):
    capsys.readouterr()
    rc = orthros_main(["generate", *argv])
    err = capsys.readouterr().err
    assert rc == code, err
    lines = [ln for ln in err.strip().splitlines() if "Loading weights" not in ln]  # (a progress bar)
    assert len(lines) == 1 and lines[0].startswith("orthros generate: error: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


def test_bad_sampling_options_are_named(ckpt, capsys):
    for argv, needle in ((["--temperature", "-0.5"], "--temperature must be a finite number >= 0"),
                         (["--top-p", "1.5"], "--top-p must be a number in (0, 1]"),
                         (["--top-k", "-1"], "--top-k must be an integer >= 0")):
        refused(["--model", str(ckpt), *argv, "hi"], capsys, needle)


def test_missing_path(tmp_path, capsys):
    refused(["--model", str(tmp_path / "nope"), "hi"], capsys, str(tmp_path / "nope"), "no such directory")


def test_an_empty_model_or_tokenizer_path_is_named(ckpt, tmp_path, capsys, monkeypatch):
    """An empty path (an unset shell variable) is no directory: refused by name (was: ``--model ""`` read
    as the current folder, 'no config.json'; ``--tokenizer ""`` taken for the default, --model's)."""
    monkeypatch.chdir(tmp_path)
    for blank in ("", " "):
        refused(["--model", blank, "hi"], capsys, f"--model is empty ({blank!r})")
        refused(["--model", str(ckpt), "--tokenizer", blank, "hi"], capsys, f"--tokenizer is empty ({blank!r})")
    assert not any(tmp_path.iterdir())


def test_typo_directory_is_not_a_hub_lookup(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("ckpt_typo", "my-org/ckpt_typo", "./ckpt_typo"):
        refused(["--model", name, "hi"], capsys, name, "no such directory", "nothing is downloaded")


def test_file_instead_of_directory(tmp_path, capsys):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    refused(["--model", str(f), "hi"], capsys, "not a directory")


def test_gguf_file_or_folder_names_the_conversion(tmp_path, capsys):
    f = tmp_path / "m" / "SmolLM2.Q4_1.gguf"
    f.parent.mkdir()
    f.write_bytes(b"GGUF")
    refused(["--model", str(f), "hi"], capsys, "not a directory", "GGUF", f"orthros convert {f} DST")
    refused(["--model", str(f.parent), "hi"], capsys, "no config.json", "GGUF", f"orthros convert {f.parent} DST")


def _phi3_gguf(path):
    """A GGUF file of architecture phi3 (one orthros convert does not take): a header and one tensor."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path.parent.mkdir(exist_ok=True)
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_of_an_architecture_convert_does_not_take_is_named(tmp_path, capsys):
    """generate (and bench, through the same check) said "convert it first" for any GGUF, also one of an
    architecture orthros convert then refused: now it says what orthros info says, read from the file's header."""
    f = _phi3_gguf(tmp_path / "m" / "m.gguf")
    tail = ("of architecture 'phi3', not an Orthros checkpoint; orthros convert cannot make it one (the GGUF "
            "architectures it converts: llama, qwen2, qwen3)")
    for path, what in ((f, "a GGUF file"), (f.parent, "holds the GGUF file m.gguf,")):
        err = refused(["--model", str(path), "hi"], capsys, f"error: --model {path}: {what} {tail}\n")
        assert "convert it first" not in err, err
    capsys.readouterr()
    assert orthros_main(["bench", "prefill", "--model", str(f)]) == 2
    assert f"--model {f}: a GGUF file {tail}" in capsys.readouterr().err


def test_the_remote_codes_checks_name_a_ggufs_architecture_too(ckpt, tmp_path, monkeypatch):
    """checkpoint_files.py travels in the remote code (from_pretrained(..., trust_remote_code=True) where orthros
    is not installed) and reads a GGUF's architecture from its header with the standard library: there too a phi3
    GGUF is named as such, not sent to "convert it first"."""
    import importlib

    f = _phi3_gguf(tmp_path / "m.gguf")
    pkg = tmp_path / "remote_pkg_gguf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for code in ckpt.glob("*.py"):
        shutil.copy(code, pkg / code.name)
    assert not [p.name for p in pkg.glob("*.py") if "gguf" in p.name or "conversion" in p.name]
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        remote = importlib.import_module("remote_pkg_gguf.checkpoint_files")
        with pytest.raises(ValueError, match=f"{re.escape(str(f))}: a GGUF file of architecture 'phi3', not an "
                                             f"Orthros checkpoint"):
            remote.checkpoint_dir(f)
    finally:
        for name in [m for m in sys.modules if m.startswith("remote_pkg_gguf")]:
            del sys.modules[name]


def test_unconverted_llama_checkpoint(tmp_path, capsys):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    d = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(d)
    refused(["--model", str(d), "hi"], capsys, "model_type 'llama'", "orthros convert")


def test_directory_without_a_tokenizer(ckpt, tmp_path, capsys):
    d = tmp_path / "no_tok"
    d.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(ckpt / name, d / name)
    refused(["--model", str(d), "hi"], capsys, "no tokenizer files", "--tokenizer")
    refused(["--model", str(ckpt), "--tokenizer", str(tmp_path / "none"), "hi"], capsys, "--tokenizer",
            "no such directory")


def test_tokenizer_folder_refusals_advise_what_fits_the_argument(ckpt, tmp_path, capsys):
    """A --tokenizer folder holding no tokenizer was told "or pass --tokenizer DIR" (it was one), and a file that is
    no tokenizer file was sent to its folder (--tokenizer data.txt: "--tokenizer ."): the advice fits now."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "data.txt").write_text("x")
    err = refused(["--model", str(ckpt), "--tokenizer", str(tmp_path / "empty"), "hi"], capsys,
                  f"--tokenizer {tmp_path / 'empty'}: no tokenizer files", "give the folder that holds them")
    assert "pass --tokenizer DIR" not in err, err
    err = refused(["--model", str(ckpt), "--tokenizer", str(tmp_path / "data.txt"), "hi"], capsys,
                  f"--tokenizer {tmp_path / 'data.txt'}: a file; --tokenizer takes the directory that holds")
    assert f"(--tokenizer {tmp_path})" not in err, err
    # a tokenizer's own file: the folder that holds it is what was meant
    refused(["--model", str(ckpt), "--tokenizer", str(ckpt / "tokenizer.json"), "hi"], capsys,
            f"(--tokenizer {ckpt})")


def test_a_model_folder_that_cannot_be_listed_is_no_traceback(tmp_path, capsys, unlistable):
    """A --model folder with no config.json that this user may not list (the tests run as root: listing it is
    made to fail) is "no config.json", not a PermissionError traceback from looking for a .gguf file in it."""
    d = tmp_path / "locked"
    d.mkdir()
    unlistable(d)
    refused(["--model", str(d), "hi"], capsys, f"--model {d}: no config.json (not a checkpoint directory)")


def test_config_json_broken(ckpt, tmp_path, capsys):
    d = shutil.copytree(ckpt, tmp_path / "ck")
    (d / "config.json").write_text("{")
    refused(["--model", str(d), "hi"], capsys, "config.json is not readable JSON")
    (d / "config.json").unlink()
    refused(["--model", str(d), "hi"], capsys, "no config.json")


@pytest.mark.parametrize("cut", [100, 10 ** 9])
def test_truncated_or_corrupted_safetensors(ckpt, tmp_path, capsys, cut):
    d = shutil.copytree(ckpt, tmp_path / "ck")
    w = d / "model.safetensors"
    raw = w.read_bytes()
    w.write_bytes(raw[:-cut] if cut < len(raw) else b"\x07" * 8 + raw[8:])
    before = listing(tmp_path)
    refused(["--model", str(d), "hi"], capsys, str(w))
    assert listing(tmp_path) == before  # nothing written, nothing removed


def test_prompt_longer_than_the_model_positions(ckpt, capsys):
    words = " ".join(["the river"] * MPE)
    refused(["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "2", words], capsys,
            f"max_position_embeddings={MPE}")
    refused(["--model", str(ckpt), "--device", "cpu", "--max-seq-len", str(MPE + 1), "hi"], capsys,
            f"--max-seq-len {MPE + 1}", f"max_position_embeddings={MPE}")


def test_generate_still_works_within_the_limits(ckpt, capsys):
    capsys.readouterr()
    assert orthros_main(["generate", "--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "3",
                         "The river"]) == 0
    assert capsys.readouterr().out.strip()


def test_exit_code_and_one_line_through_the_console_entry(tmp_path):
    r = subprocess.run([sys.executable, "-m", "orthros", "generate", "--model", str(tmp_path / "nope"), "hi"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"orthros generate: error: --model {tmp_path / 'nope'}: no such "
                                             f"directory (a local Orthros checkpoint directory is needed; nothing "
                                             f"is downloaded)"]


# --------------------------------------------------- refused before the weights load (issue hunt)

@pytest.fixture
def no_weights(monkeypatch):
    """Any load of the model's weights fails the test: these inputs must be refused before it."""
    from orthros.models import OrthrosForCausalLM

    def refuse(*a, **k):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(OrthrosForCausalLM, "from_pretrained", refuse)


@pytest.mark.parametrize("prompt", [[""], ["", ""]])
def test_an_empty_prompt_argument_is_named_before_anything_loads(tmp_path, capsys, no_weights, prompt):
    """Was: ``orthros generate --model M ""`` said only "empty prompt" (which one? the argument, stdin?), after the
    checkpoint and the tokenizer were read: now the positional prompt is named with what is allowed, first (a
    missing --model is not even looked at)."""
    refused(["--model", str(tmp_path / "nope"), *prompt], capsys,
            "the prompt argument is empty", "give the text to continue", "leave it out to read stdin")


def test_an_empty_stdin_prompt_says_so(ckpt, capsys, no_weights, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    refused(["--model", str(ckpt)], capsys, "the prompt read from stdin is empty", "give the prompt as an argument")


@pytest.mark.parametrize("device", ["nonsense", "cuda:x", "meta", "mps"])
def test_device_outside_the_documented_ones(ckpt, capsys, no_weights, device):
    """Was: exit 1 with torch's "RuntimeError: Expected one of cpu, cuda, ..." (not naming
    --device), or, for a real device type the CLI does not run on (meta, mps), a failure after
    the checkpoint loaded."""
    refused(["--model", str(ckpt), "--device", device, "--max-new-tokens", "2", "hi"], capsys,
            "--device must be auto, cpu, cuda or cuda:N", repr(device))


def test_device_index_beyond_the_machine(ckpt, capsys, no_weights, monkeypatch):
    """Was: cuda:N past the machine's devices failed at ``.to(device)``, after the weights loaded."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    refused(["--model", str(ckpt), "--device", "cuda:3", "--max-new-tokens", "2", "hi"], capsys,
            "--device cuda:3", "1 CUDA device(s), cuda:0 to cuda:0")


def test_chat_needs_a_chat_template(ckpt, tmp_path, capsys, monkeypatch, no_weights):
    """Was: --chat --interactive loaded the model, then refused every turn (exit 0); --chat with
    a prompt was refused with transformers' message, which does not name --chat."""
    import io
    import json

    d = shutil.copytree(ckpt, tmp_path / "ck")
    (d / "chat_template.jinja").unlink()
    assert "chat_template" not in json.loads((d / "tokenizer_config.json").read_text())
    (tmp_path / "p.txt").write_text("hi\n")
    for extra in (["hi"], ["--interactive"], ["--prompts", str(tmp_path / "p.txt")]):
        monkeypatch.setattr(sys, "stdin", io.StringIO("hi\nthere\n"))
        refused(["--model", str(d), "--device", "cpu", "--max-new-tokens", "2", "--chat", *extra], capsys,
                "--chat: the tokenizer in", "has no chat template")


def test_interactive_max_new_tokens_beyond_the_cache(ckpt, capsys, monkeypatch, no_weights):
    """Was: with --interactive (no first turn to check) the model loaded, then every turn was
    refused (exit 0): the default --max-new-tokens 256 never fits a 64-position model."""
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    refused(["--model", str(ckpt), "--device", "cpu", "--interactive"], capsys, "--max-new-tokens 256",
            f"--max-seq-len {MPE}", f"max_position_embeddings={MPE}")
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n"))
    refused(["--model", str(ckpt), "--device", "cpu", "--interactive", "--max-seq-len", "8", "--max-new-tokens",
             "9"], capsys, "--max-new-tokens 9 does not fit --max-seq-len 8")


def test_interactive_max_new_tokens_within_the_cache_still_runs(ckpt, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("The river\n"))
    capsys.readouterr()
    assert orthros_main(["generate", "--model", str(ckpt), "--device", "cpu", "--interactive", "--max-seq-len", "8",
                         "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.strip()


def test_output_under_a_file(ckpt, tmp_path, capsys, no_weights):
    """Was: ``-o FILE/out.jsonl`` generated every prompt, then failed writing (FileExistsError,
    exit 1)."""
    (tmp_path / "p.txt").write_text("hi\n")
    (tmp_path / "afile").write_text("keep")
    before = listing(tmp_path)
    for out in (tmp_path / "afile" / "out.jsonl", tmp_path / "afile" / "sub" / "out.jsonl"):
        refused(["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "2", "--prompts",
                 str(tmp_path / "p.txt"), "-o", str(out)], capsys, f"--output {out}",
                f"{tmp_path / 'afile'} is a file, not a directory")
    assert listing(tmp_path) == before


def test_output_inside_the_model_or_tokenizer_directory(ckpt, tmp_path, capsys, no_weights):
    """Was: ``-o CKPT/config.json`` ran every prompt, then replaced the checkpoint's config.json with
    the records (exit 0; the checkpoint no longer loaded). An --output inside the --model or
    --tokenizer directory, or a link to one of their files, is refused before anything loads."""
    (tmp_path / "p.txt").write_text("hi\n")
    tok = tmp_path / "tok"
    shutil.copytree(ckpt, tok, ignore=lambda d, names: [n for n in names if not n.startswith("tokenizer")])
    (tmp_path / "link.json").symlink_to(ckpt / "config.json")
    before = listing(ckpt), listing(tmp_path)
    run = ["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "2", "--prompts", str(tmp_path / "p.txt")]
    for extra, out, opt, d in (([], ckpt / "config.json", "--model", ckpt),
                               ([], ckpt / "new.jsonl", "--model", ckpt),
                               ([], tmp_path / "link.json", "--model", ckpt),
                               (["--tokenizer", str(tok)], tok / "tokenizer.json", "--tokenizer", tok)):
        refused([*run, *extra, "-o", str(out)], capsys, f"--output {out} is inside the {opt} directory {d}")
    assert (listing(ckpt), listing(tmp_path)) == before


def test_tokenizer_that_is_not_the_models(tmp_path, capsys, no_weights):
    """Was: a tokenizer with ids past the model's vocab_size was found out by the engine, after
    the weights loaded ("prompts[0] has token ids outside ...")."""
    d = make_tiny_checkpoint(tmp_path / "small_vocab", max_position_embeddings=MPE, vocab_size=100)
    (tmp_path / "p.txt").write_text("hello world\n")
    base = ["--model", str(d), "--device", "cpu", "--max-new-tokens", "2"]
    refused(base + ["hello world"], capsys, "the prompt encodes to token id", "vocab_size=100",
            "does not belong to --model")
    refused(base + ["--prompts", str(tmp_path / "p.txt")], capsys, "p.txt:1: the prompt encodes to token id",
            "vocab_size=100")


def test_interactive_turn_of_a_tokenizer_that_is_not_the_models(tmp_path, capsys, monkeypatch):
    """An --interactive turn is known only after the weights load. Was: such a turn was refused in the
    engine's words ("prompts[0] has token ids outside the vocabulary ...: prompts[0][0] = 261"), an argument
    the user never gave; it is said as the prompt argument's is, and the session goes on."""
    import io

    d = make_tiny_checkpoint(tmp_path / "small_vocab", max_position_embeddings=MPE, vocab_size=100)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello world\n"))
    capsys.readouterr()
    assert orthros_main(["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "2",
                         "--interactive"]) == 0
    err = capsys.readouterr().err
    assert "this turn encodes to token id" in err and "does not belong to --model" in err, err
    assert "prompts[0]" not in err, err


def test_prompt_that_is_not_utf8(ckpt, tmp_path, capsys, no_weights):
    """Was: bytes that are not UTF-8 in a prompt (argv and stdin keep them as lone surrogates)
    reached the tokenizer: "TypeError: TextEncodeInput must be ...", exit 1; in a --prompts file,
    the codec's message without the option or the file."""
    refused(["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "2", "\udcffhi"], capsys,
            "the prompt is not UTF-8 text")
    f = tmp_path / "p.txt"
    f.write_bytes(b"\xff\xfehi\n")
    refused(["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "2", "--prompts", str(f)], capsys,
            f"--prompts {f}: not UTF-8 text")


def test_lone_surrogate_in_a_jsonl_prompt_or_the_system_message(ckpt, tmp_path, capsys, no_weights):
    """Was: a JSON escape of half a surrogate pair ("\\udcff", valid JSON) in a --prompts record,
    or a --system text with a byte that is not UTF-8, reached the tokenizer: "TypeError:
    TextEncodeInput must be ...", exit 1, naming neither the file's line nor --system."""
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hi"}\n{"prompt": "\\udcffhi"}\n')
    base = ["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "2"]
    refused(base + ["--prompts", str(f)], capsys, f"--prompts {f}:2: the prompt is not UTF-8 text")
    refused(base + ["--chat", "--system", "be \udcff", "hi"], capsys, "--system is not UTF-8 text")


def test_interactive_line_that_is_not_utf8_is_reported_and_the_conversation_goes_on(ckpt, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("The river\n\udcffhi\nThe sea\n"))
    capsys.readouterr()
    rc = orthros_main(["generate", "--model", str(ckpt), "--device", "cpu", "--interactive", "--max-seq-len", "32",
                       "--max-new-tokens", "3"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert len(cap.out.strip("\n").split("\n")) == 2
    assert cap.err.count("orthros generate: error: the prompt is not UTF-8 text") == 1, cap.err


def test_a_reader_that_stops_early_is_no_error(ckpt):
    """``orthros generate ... | head -c 5``: was "orthros generate: error: BrokenPipeError: [Errno 32]
    Broken pipe" and exit 1 (the command's own catch-all took it); now what every command does, a
    quiet exit 141 (128 + SIGPIPE)."""
    import os
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "orthros", "generate", "--model", str(ckpt), "--device", "cpu",
                          "--max-new-tokens", "8", "The river"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=repo, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=300) == 141 and err == "", err


def test_orthros_traceback_shows_a_runtime_failure_s_traceback(ckpt, monkeypatch, capsys):
    """README: ``ORTHROS_TRACEBACK=1`` shows the traceback of a failure while working, for every
    command. Was: generate's own catch-all printed its one line anyway."""
    from orthros.engine import engine as engine_mod

    def fail(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine_mod.Engine, "stream", fail)
    argv = ["generate", "--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "2", "hi"]
    refused(argv[1:], capsys, "RuntimeError: boom", code=1)
    monkeypatch.setenv("ORTHROS_TRACEBACK", "0")  # was: any value, "0" too, showed the traceback
    refused(argv[1:], capsys, "RuntimeError: boom", code=1)
    monkeypatch.setenv("ORTHROS_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="boom"):
        orthros_main(argv)
