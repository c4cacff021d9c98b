"""The plugin's checks that need no vLLM (they run in the main environment too): a model path or
tokenizer vLLM would fail to read with errors of its own that name neither the path nor what is
missing."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from orthros.serving import _ConfigChecks, check_tokenizer


def test_a_model_directory_without_a_tokenizer_is_named(tmp_path):
    """vLLM loaded the tokenizer of a checkpoint saved without one with transformers' "Couldn't
    instantiate the backend tokenizer from one of: (1) a `tokenizers` library serialization file, ..."
    (a ValueError four lines long naming no path)."""
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=re.escape(f"the model directory {model} holds no tokenizer files "
                                                   f"(tokenizer.json, ")) as e:
        check_tokenizer(str(model), model=str(model))
    assert "--tokenizer DIR" in str(e.value) and "--skip-tokenizer-init" in str(e.value)
    (model / "tokenizer.json").write_text("{}")
    check_tokenizer(str(model), model=str(model))


def test_a_tokenizer_path_that_does_not_exist_is_named(tmp_path):
    """`--tokenizer /no/such/dir` was "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"."""
    missing = tmp_path / "tok"
    with pytest.raises(ValueError, match=re.escape(f"the tokenizer {missing} (--tokenizer, tokenizer= in vllm.LLM): "
                                                   f"no such directory")):
        check_tokenizer(str(missing), model=str(tmp_path))
    with pytest.raises(ValueError, match=re.escape(f"the tokenizer {tmp_path} (--tokenizer, tokenizer= in vllm.LLM) "
                                                   f"holds no tokenizer files")):
        check_tokenizer(str(tmp_path), model="org/model")
    check_tokenizer("org/tokenizer", model="org/model")  # a hub name: vLLM looks it up


def test_the_config_hook_checks_the_tokenizer_unless_vllm_skips_it(tmp_path):
    """The hook vLLM runs on an Orthros model's config (registered by ``register``), before it loads
    the tokenizer; with --skip-tokenizer-init no tokenizer is read, so none is needed."""
    cfg = SimpleNamespace(model=str(tmp_path), tokenizer=str(tmp_path), skip_tokenizer_init=False)
    with pytest.raises(ValueError, match="holds no tokenizer files"):
        _ConfigChecks.verify_and_update_model_config(cfg)
    cfg.skip_tokenizer_init = True
    _ConfigChecks.verify_and_update_model_config(cfg)
    _ConfigChecks.verify_and_update_config(SimpleNamespace(model_config=cfg))


def test_the_config_hook_leaves_a_mistral_format_tokenizer_to_vllm(tmp_path):
    """A directory holding only Mistral-format tokenizer files (tekken.json, tokenizer.model.v3), served with
    --tokenizer-mode mistral, was refused as holding no tokenizer files: vLLM's mistral mode reads those."""
    (tmp_path / "tekken.json").write_text("{}")
    (tmp_path / "tokenizer.model.v3").write_bytes(b"")
    cfg = SimpleNamespace(model=str(tmp_path), tokenizer=str(tmp_path), skip_tokenizer_init=False,
                          tokenizer_mode="mistral")
    _ConfigChecks.verify_and_update_model_config(cfg)
    cfg.tokenizer_mode = "auto"
    with pytest.raises(ValueError, match="holds no tokenizer files"):
        _ConfigChecks.verify_and_update_model_config(cfg)
