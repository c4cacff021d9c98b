"""``orthros generate`` on bad input: one clear line on stderr naming the problem, exit code 2,
nothing written, no traceback and no hub lookup. Also the position limit (prompt longer than
``max_position_embeddings``) across the CLI and the engine."""

from __future__ import annotations

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
