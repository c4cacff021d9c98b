"""Checkpoint checks before loading (orthros/checkpoint_files.py; whether the weights fit the config:
orthros/models/loading.py): damaged safetensors files are named by ``from_pretrained``, complete ones
of every kind pass, local-looking paths that do not exist never become hub lookups."""

from __future__ import annotations

import json
import re
import shutil
import struct

import pytest
import torch
from transformers import AutoModelForCausalLM

from orthros.models import OrthrosConfig, OrthrosForCausalLM
from orthros.checkpoint_files import (CheckpointError, check_safetensors_file, check_tokenizer_dir, check_weights,
                                      checkpoint_dir, looks_local)


def tiny(**kw):
    torch.manual_seed(0)
    c = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, window_size=8, max_position_embeddings=128)
    c.update(kw)
    return OrthrosForCausalLM(OrthrosConfig(**c)).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("ok")
    single, sharded, half = d / "single", d / "sharded", d / "bf16"
    m = tiny()
    m.save_pretrained(single)
    m.save_pretrained(sharded, max_shard_size="20KB")
    m.to(torch.bfloat16).save_pretrained(half)
    return single, sharded, half


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_complete_checkpoints_pass(saved):
    single, sharded, half = saved
    assert [p.name for p in check_weights(single)] == ["model.safetensors"]
    shards = check_weights(sharded)
    assert len(shards) > 1 and all(p.suffix == ".safetensors" for p in shards)
    check_weights(half)
    for d in saved:
        AutoModelForCausalLM.from_pretrained(d)


def _truncate(p):
    p.write_bytes(p.read_bytes()[:-100])


def _header_garbage(p):
    b = bytearray(p.read_bytes())
    b[8:40] = b"\xff" * 32
    p.write_bytes(bytes(b))


def _huge_header(p):
    b = p.read_bytes()
    p.write_bytes(struct.pack("<Q", 10 ** 12) + b[8:])


def _trailing(p):
    p.write_bytes(p.read_bytes() + b"\0" * 16)


def _empty(p):
    p.write_bytes(b"")


@pytest.mark.parametrize("damage, match", [(_truncate, "truncated safetensors file"),
                                           (_header_garbage, "corrupted safetensors header"),
                                           (_huge_header, "truncated or not a safetensors file"),
                                           (_trailing, "bytes after the last tensor"),
                                           (_empty, "no header")])
def test_from_pretrained_names_the_damaged_file(saved, tmp_path, damage, match):
    d = _copy(saved[1], tmp_path / "ck")
    victim = sorted(d.glob("*.safetensors"))[-1]
    damage(victim)
    for load in (OrthrosForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(CheckpointError, match=match) as e:
            load(d)
        assert str(victim) in str(e.value) and "\n" not in str(e.value)


def test_index_naming_a_missing_shard(saved, tmp_path):
    d = _copy(saved[1], tmp_path / "ck")
    gone = sorted(d.glob("*.safetensors"))[0]
    gone.unlink()
    with pytest.raises(CheckpointError, match=f"missing: {gone.name}"):
        AutoModelForCausalLM.from_pretrained(d)
    (d / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a safetensors index"):
        AutoModelForCausalLM.from_pretrained(d)


def test_every_dtype_safetensors_writes_is_a_complete_file(tmp_path):
    """Issue: the FNUZ float8 dtypes (F8_E4M3FNUZ, F8_E5M2FNUZ: ROCm's fp8), which safetensors writes,
    were missing from the byte sizes: a complete file holding one was called a corrupted header."""
    from safetensors.torch import save_file

    names = ("bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
             "float32", "float64", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
             "float8_e8m0fnu")
    for name in names:
        if not hasattr(torch, name):
            continue
        p = tmp_path / f"{name}.safetensors"
        save_file({"w": torch.zeros(3, 5).to(getattr(torch, name))}, p)
        assert list(check_safetensors_file(p)) == ["w"], name


def test_header_with_wrong_tensor_size(saved, tmp_path):
    d = _copy(saved[0], tmp_path / "ck")
    p = d / "model.safetensors"
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = [s * 2 for s in header[name]["shape"]]
    h = json.dumps(header).encode()
    h += b" " * (n - len(h)) if len(h) <= n else b""
    p.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    with pytest.raises(CheckpointError, match=f"tensor '{name}' spans bytes"):
        check_safetensors_file(p)


def test_local_looking_missing_paths_never_reach_the_hub(tmp_path, monkeypatch):
    import socket

    def no_network(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    for path in (tmp_path / "typo", "./typo_dir", "~/no/such/orthros/ckpt", "a/b/c"):
        assert looks_local(path)
        with pytest.raises(FileNotFoundError, match="no such checkpoint directory"):
            OrthrosForCausalLM.from_pretrained(path)
    assert not looks_local("org/name") and not looks_local("name")


def test_an_empty_path_is_refused_by_name(tmp_path, monkeypatch):
    """``Path("")`` is the current folder: ``orthros info ""`` said 'PATH : no config.json (not a
    checkpoint directory)' of a path never given; an empty or blank path is refused as such."""
    from orthros.checkpoint_files import check_tokenizer_dir, checkpoint_dir

    monkeypatch.chdir(tmp_path)
    for blank in ("", " ", "\t"):
        with pytest.raises(CheckpointError, match=re.escape(f"PATH is empty ({blank!r})")):
            checkpoint_dir(blank, arg="PATH")
        with pytest.raises(CheckpointError, match=re.escape(f"--tokenizer is empty ({blank!r})")):
            check_tokenizer_dir(blank)


def test_a_home_relative_checkpoint_directory_loads(saved, tmp_path, monkeypatch):
    # '~/ckpt' passed the local checks (they expand '~'), then transformers took it for a repo id:
    # "OSError: Repo id must use alphanumeric chars ... '~/ckpt'"
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(saved[0], tmp_path / "ckpt")
    model = OrthrosForCausalLM.from_pretrained("~/ckpt")
    ids = torch.randint(0, 64, (1, 5))
    torch.testing.assert_close(model(ids).logits, OrthrosForCausalLM.from_pretrained(saved[0])(ids).logits)


def test_a_file_is_named_as_not_a_checkpoint_directory(saved, tmp_path):
    # config.json failed as an UnpicklingError about torch.load's weights_only, model.safetensors as
    # 'the config file ... is not a valid JSON file'
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    for f in (saved[0] / "config.json", saved[0] / "model.safetensors"):
        with pytest.raises(CheckpointError, match=f"not a directory .*; pass the directory that holds it: .*{saved[0].name}$"):
            OrthrosForCausalLM.from_pretrained(f)
    with pytest.raises(CheckpointError, match="not a directory .*; it is a GGUF checkpoint: convert it first"):
        OrthrosForCausalLM.from_pretrained(tmp_path / "m.gguf")
    with pytest.raises(CheckpointError, match="not a directory"):  # AutoConfig reads it as the config first
        AutoModelForCausalLM.from_pretrained(saved[0] / "config.json")


def test_another_model_types_checkpoint_is_named_to_convert(saved, tmp_path):
    # Qwen2 failed with "OrthrosConfig has no `sliding_window` ...; use `window_size`"; Llama with
    # attention_bias loaded, its o_proj biases dropped (transformers only logged them)
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    LlamaForCausalLM(LlamaConfig(**small, attention_bias=True)).save_pretrained(tmp_path / "llama")
    Qwen2ForCausalLM(Qwen2Config(**small)).save_pretrained(tmp_path / "qwen2")
    for name in ("llama", "qwen2"):
        with pytest.raises(CheckpointError, match=f"model_type '{name}' is not an Orthros checkpoint; convert it "
                                                  f"first: orthros convert .*{name} DST"):
            OrthrosForCausalLM.from_pretrained(tmp_path / name)
    # a config of the caller's own is what it asked to build: transformers loads what fits
    own = OrthrosForCausalLM.from_pretrained(tmp_path / "llama", config=OrthrosConfig(**small, attention_bias=True,
                                                                                     o_proj_bias=True))
    assert own.model.layers[0].self_attn.o_proj.bias is not None


def test_every_model_type_orthros_convert_takes_is_named_to_convert(tmp_path):
    """A Qwen3.5 text checkpoint (model_type qwen3_5_text, which `orthros convert` takes) was refused as
    "not an Orthros checkpoint (convertible to Orthros: llama, qwen2, qwen3, mistral)": the list
    lacked it. It is the converter's list of model types (checkpoint_files.py cannot import the converter:
    remote code), so the two are compared here."""
    from orthros.conversion.architectures import _MODEL_TYPES
    from orthros.checkpoint_files import CONVERTIBLE

    assert sorted(CONVERTIBLE) == sorted(_MODEL_TYPES)
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text"}))
    with pytest.raises(CheckpointError, match="'qwen3_5_text' is not an Orthros checkpoint; convert it first"):
        OrthrosForCausalLM.from_pretrained(tmp_path / "q")


def test_a_training_runs_directory_names_its_latest_checkpoint(saved, tmp_path):
    """``from_pretrained(output_dir)`` of a training run (config.json only in its checkpoints):
    one line naming the latest checkpoint, instead of transformers' missing-file error."""
    run = tmp_path / "run"
    for step in (5, 40):
        (_copy(saved[0], run / "checkpoints" / f"step_{step:08d}") / "manifest.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"it looks like a training run: its latest checkpoint is .*step_00000040"):
        OrthrosForCausalLM.from_pretrained(run)
    assert OrthrosForCausalLM.from_pretrained(run / "checkpoints" / "step_00000040") is not None


def test_a_training_runs_checkpoint_cut_short_is_not_named(saved, tmp_path):
    """The hint names the latest *complete* checkpoint, as resuming picks it (orthros/layout.py):
    a newer ``step_*`` folder without ``manifest.json`` (a save cut short) was named, though a load
    of it may fail or give half-written weights; nor is a folder of another name (``step_5``)."""
    run = tmp_path / "run"
    (_copy(saved[0], run / "checkpoints" / "step_00000005") / "manifest.json").write_text("{}")
    _copy(saved[0], run / "checkpoints" / "step_00000040")  # no manifest.json: cut short
    _copy(saved[0], run / "checkpoints" / "step_9")
    (_copy(saved[0], run / "checkpoints" / "step_x") / "manifest.json").write_text("{}")
    for d, said in ((run, "it looks like a training run"), (run / "checkpoints", "it is a training run's checkpoints folder")):
        with pytest.raises(CheckpointError) as e:
            checkpoint_dir(d)
        assert f"{said}: its latest checkpoint is {run / 'checkpoints' / 'step_00000005'}" in str(e.value), str(e.value)
    (run / "checkpoints" / "step_00000005" / "manifest.json").unlink()  # none complete: no checkpoint named
    with pytest.raises(CheckpointError) as e:
        checkpoint_dir(run)
    assert "step_" not in str(e.value) and "no complete checkpoint" in str(e.value), str(e.value)


def test_weights_that_do_not_fit_the_config_are_named(saved, tmp_path):
    """A tensor the files lack (transformers would leave it at random and only log it) or one of
    another shape is named with the argument, from the headers alone; a complete checkpoint and
    a tied embedding without a stored lm_head pass."""
    from safetensors.torch import load_file, save_file

    from orthros.models.loading import check_weights_fit

    single, sharded, _ = saved
    for d in (single, sharded):
        check_weights_fit(d, OrthrosConfig.from_pretrained(d))
    d = _copy(single, tmp_path / "holed")
    sd = load_file(d / "model.safetensors")
    del sd["model.norm.weight"]
    sd["model.layers.0.mlp.up_proj.weight"] = sd["model.layers.0.mlp.up_proj.weight"][:8]
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"--model .*holed: the weights do not fit its config.json: missing "
                                              r"model.norm.weight; model.layers.0.mlp.up_proj.weight of shape \[8, 32\]"):
        check_weights_fit(d, OrthrosConfig.from_pretrained(d))
    from orthros.evaluation.common import load_model  # every eval command's loader checks first

    with pytest.raises(CheckpointError, match="missing model.norm.weight"):
        load_model(d)
    tied = tmp_path / "tied"
    tiny(tie_word_embeddings=True).save_pretrained(tied)
    check_weights_fit(tied, OrthrosConfig.from_pretrained(tied))


def test_a_single_file_beside_an_index_is_what_is_checked(saved, tmp_path):
    """transformers loads ``model.safetensors`` when it is there, even beside an index: the checks
    read the same file (they read the index's shards, here a missing one, and refused a sound
    checkpoint), and the load gives the single file's weights."""
    single, _, _ = saved
    d = _copy(single, tmp_path / "both")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm_head.weight": "gone.safetensors"}}))
    assert check_weights(d) == [d / "model.safetensors"]
    got = OrthrosForCausalLM.from_pretrained(d)
    torch.testing.assert_close(got.lm_head.weight, OrthrosForCausalLM.from_pretrained(single).lm_head.weight)


def test_an_orthros_checkpoint_run_as_full_attention_reports_no_unexpected_weights(tmp_path):
    """Was: loading an Orthros checkpoint with attention_mode full or window (orthros eval ppl --attention-mode,
    the paper's ablations) printed transformers' load report with every layer's alpha / beta as UNEXPECTED."""
    from transformers import AutoConfig

    from orthros.evaluation.common import make_tiny_checkpoint
    from orthros.kinds import layer_type_for

    d = make_tiny_checkpoint(tmp_path / "ck", max_position_embeddings=64)
    for mode in ("full", "window"):
        config = AutoConfig.from_pretrained(d)
        config.attention_mode = mode
        config.layer_types = [layer_type_for(mode)] * config.num_hidden_layers
        _, info = OrthrosForCausalLM.from_pretrained(d, config=config, output_loading_info=True)
        assert not info["unexpected_keys"] and not info["missing_keys"], info
    _, info = OrthrosForCausalLM.from_pretrained(d, output_loading_info=True)  # its own mode: every tensor used
    assert not info["unexpected_keys"]


@pytest.mark.parametrize("call, arg", [
    (lambda: checkpoint_dir("~nosuchuser9/m"), "--model"),
    (lambda: check_tokenizer_dir("~nosuchuser9/m"), "--tokenizer"),
    (lambda: check_weights("~nosuchuser9/m"), "path"),
    (lambda: OrthrosForCausalLM.from_pretrained("~nosuchuser9/m"), "pretrained_model_name_or_path"),
])
def test_a_home_folder_of_no_user_is_a_checkpoint_error_naming_the_argument(call, arg):
    """`~nosuchuser9/m` reached pathlib's expanduser: a bare RuntimeError('Could not determine home
    directory.') naming neither the path nor the argument. Now a CheckpointError names both."""
    with pytest.raises(CheckpointError, match=rf"^{re.escape(arg)} ~nosuchuser9/m: no user 'nosuchuser9'"):
        call()


def test_a_directory_without_weights_is_named_so_and_pytorch_bin_weights_are_left_to_the_load(saved, tmp_path):
    """No weight file at all was "the weights do not fit its config.json: missing lm_head.weight; ..." (every
    tensor listed as missing), and so was a checkpoint of ``pytorch_model.bin`` weights, which
    ``from_pretrained`` loads: ``orthros generate`` / ``eval`` refused it."""
    from safetensors.torch import load_file

    from orthros.evaluation.common import load_model
    from orthros.models.loading import check_weights_fit

    single = saved[0]
    config = OrthrosConfig.from_pretrained(single)
    empty = _copy(single, tmp_path / "empty")
    (empty / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"--model .*empty: no weights \(model.safetensors, "
                                              r"model.safetensors.index.json or pytorch_model.bin\)"):
        check_weights_fit(empty, config)
    with pytest.raises(CheckpointError, match="no weights"):
        load_model(empty)
    binary = _copy(single, tmp_path / "bin")
    sd = load_file(binary / "model.safetensors")
    (binary / "model.safetensors").unlink()
    torch.save(sd, binary / "pytorch_model.bin")
    check_weights_fit(binary, config)
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        torch.testing.assert_close(load_model(binary)(ids).logits, OrthrosForCausalLM.from_pretrained(single)(ids).logits)


def test_a_directory_without_config_json_is_named_so_unless_a_config_is_given(saved, tmp_path):
    """Weights without their config.json (a copy that left it behind) were loaded into a model of
    ``OrthrosConfig()``'s defaults: transformers' "You set `ignore_mismatched_sizes` to `False`"
    RuntimeError, or, with sizes that happened to match, a silent load with the defaults' window and
    RoPE. An empty directory was "no file named model.safetensors". With ``config=`` it loads."""
    single = saved[0]
    bare = _copy(single, tmp_path / "bare")
    (bare / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"bare: no config.json \(not a checkpoint directory"):
        OrthrosForCausalLM.from_pretrained(bare)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty: no config.json"):
        OrthrosForCausalLM.from_pretrained(tmp_path / "empty")
    (tmp_path / "outer").mkdir()
    shutil.move(bare, tmp_path / "outer" / "sub")
    with pytest.raises(CheckpointError, match=r"outer: no config.json in subfolder 'sub'"):
        OrthrosForCausalLM.from_pretrained(tmp_path / "outer", subfolder="sub")
    got = OrthrosForCausalLM.from_pretrained(tmp_path / "outer" / "sub", config=OrthrosConfig.from_pretrained(single))
    torch.testing.assert_close(got.lm_head.weight, OrthrosForCausalLM.from_pretrained(single).lm_head.weight)


def test_save_pretrained_expands_home_and_refuses_a_file_before_writing(tmp_path, monkeypatch):
    """``save_pretrained("~/ck")`` made a folder named ``~`` in the working one, which
    ``from_pretrained("~/ck")`` (which expands it) did not find; a file as the folder was logged by
    transformers and nothing written, returning as if saved; ``""`` was a bare FileNotFoundError."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    m = tiny()
    for save in (m.save_pretrained, m.config.save_pretrained):
        save("~/ck")
        assert (home / "ck" / "config.json").is_file() and not (cwd / "~").exists()
    assert torch.equal(OrthrosForCausalLM.from_pretrained("~/ck").lm_head.weight, m.lm_head.weight)
    (cwd / "file").write_text("x")
    for save in (m.save_pretrained, m.config.save_pretrained):
        for path in ("file", "file/sub"):
            with pytest.raises(ValueError, match=rf"^save_directory {path}: .*file is a file, not a directory"):
                save(path)
        with pytest.raises(ValueError, match=r"^save_directory is empty \(''\)"):
            save("")
    assert sorted(p.name for p in cwd.iterdir()) == ["file"] and (cwd / "file").read_text() == "x"


def test_config_from_pretrained_expands_home_and_never_looks_a_local_path_up_on_the_hub(tmp_path, monkeypatch):
    """``OrthrosConfig.from_pretrained("~/ck")`` and a missing local path were transformers' hub-lookup
    errors ("OSError: Repo id must use alphanumeric chars ... '~/ck'"), as the model's were."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    tiny().config.save_pretrained(tmp_path / "ck")
    assert OrthrosConfig.from_pretrained("~/ck").vocab_size == 64
    assert OrthrosConfig.from_pretrained("~/ck/config.json").vocab_size == 64
    for missing in ("~/nope", str(tmp_path / "nope"), "./nope"):
        with pytest.raises(FileNotFoundError, match=rf"^{re.escape(missing)}: no such checkpoint directory or config "
                                                    rf"file \(a local path is never looked up on the hub\)"):
            OrthrosConfig.from_pretrained(missing)


def test_a_tokenizer_file_given_for_its_directory_is_named_as_a_file(tmp_path):
    """``--tokenizer DIR/tokenizer.json`` said "no such directory" of a path that exists; it names the
    file and the directory meant."""
    from orthros.checkpoint_files import check_tokenizer_dir

    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: a file; --tokenizer takes the directory") as e:
        check_tokenizer_dir(tmp_path / "tokenizer.json")
    assert f"(--tokenizer {tmp_path})" in str(e.value)
    assert check_tokenizer_dir(tmp_path) == tmp_path
