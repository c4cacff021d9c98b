"""``--window-size`` larger than the source model's positions is refused (issue 17.5), the same
way from the CLI and from Python, before anything is written."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from orthros.cli import main as orthros_main
from orthros.conversion import convert_from_hf
from orthros.conversion.convert import convert_checkpoint

MPE = 64


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("llama") / "src"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=MPE)).save_pretrained(d)
    return d


def test_window_larger_than_positions_is_refused(llama, tmp_path, capsys):
    msg = f"window_size={MPE + 1} exceeds the source's max_position_embeddings={MPE}"
    with pytest.raises(ValueError, match=msg + f".*choose window_size <= {MPE}$"):
        convert_checkpoint(llama, tmp_path / "a", window_size=MPE + 1, progress=False)
    with pytest.raises(ValueError, match=msg):
        convert_from_hf(str(llama), window_size=MPE + 1)
    rc = orthros_main(["convert", str(llama), str(tmp_path / "b"), "--window-size", str(MPE + 1), "-q"])
    err = capsys.readouterr().err
    assert rc != 0 and f"--window-size {MPE + 1} exceeds the source's max_position_embeddings={MPE}" in err \
        and f"choose --window-size <= {MPE}" in err and "window_size" not in err, err  # the option typed is named
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, no temporary left


def test_window_equal_to_positions_converts(llama, tmp_path):
    convert_checkpoint(llama, tmp_path / "ok", window_size=MPE, progress=False)
    assert (tmp_path / "ok" / "config.json").is_file()
