"""Training config: YAML + overrides, nearest-key suggestions, validation (no model needed)."""

import pytest

from orthros.training.cli import main as cli_main
from orthros.training.config import ConfigError, load_config, nearest_key, parse_overrides


def test_defaults_are_valid_and_overrides_apply(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("mode: sft\noptim:\n  lr: 2.0e-4\ntrain:\n  max_steps: 7\n")
    cfg = load_config(str(p), ["--optim.warmup_steps", "3", "--seq_len", "64", "--train.compile", "--resume"])
    assert cfg.mode == "sft" and cfg.optim.lr == 2e-4 and cfg.train.max_steps == 7
    assert cfg.optim.warmup_steps == 3 and cfg.data.seq_len == 64 and cfg.train.compile is True
    assert cfg.checkpoint.resume is True
    assert load_config(None, ["--lr=1e-3"]).optim.lr == 1e-3


@pytest.mark.parametrize("key,near", [("optim.learning_rate", "optim.lr"), ("train.max_step", "train.max_steps"),
                                      ("model.widnow_size", "model.window_size"), ("seqlen", "data.seq_len"),
                                      ("gradient_accumulation_steps", "train.grad_accum")])
def test_unknown_override_names_nearest_key(key, near):
    assert nearest_key(key) == near
    with pytest.raises(ConfigError, match=f"unknown config key '{key}'.*'{near}'"):
        load_config(None, [f"--{key}", "1"])


def test_unknown_yaml_key_names_nearest_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  num_layers: 2\n")
    with pytest.raises(ConfigError, match="model.num_layers.*model.num_hidden_layers"):
        load_config(str(p))
    p.write_text("optim: 3\n")
    with pytest.raises(ConfigError, match="section 'optim' must be a mapping"):
        load_config(str(p))


@pytest.mark.parametrize("args,msg", [
    (["--mode", "rlhf"], r"mode must be one of \['pt', 'sft', 'cpt'\]"),
    (["--model.architecture", "mamba"], r"model.architecture must be one of \['orthros', 'transformer', 'swa', 'orthros-h', 'linear-hybrid', 'gdn'\]"),
    (["--seq_len", "abc"], "data.seq_len' expects int"),
    (["--seq_len", "0"], "data.seq_len must be > 0"),
    (["--mode", "cpt"], "set model.init_from"),
    (["--train.precision", "fp8"], "train.precision must be one of"),
])
def test_bad_values_are_refused(args, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(None, args)


def test_override_parsing():
    assert parse_overrides(["--a.b", "1", "--flag", "--c", "x", "--resume", "/p"]) == [
        ("a.b", 1), ("flag", True), ("c", "x"), ("checkpoint.resume", "/p")]
    with pytest.raises(ConfigError, match="expected an override"):
        parse_overrides(["oops"])


def test_cli_reports_errors_before_training(capsys, tmp_path):
    assert cli_main(["--optim.learnin_rate", "1"]) == 2
    assert "did you mean 'optim.lr'" in capsys.readouterr().err
    assert cli_main([str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    assert cli_main(["--help-config"]) == 0
    assert "optim.lr = 0.001" in capsys.readouterr().out
