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


def test_help_config_gives_each_key_its_default_and_meaning():
    """--help-config: every key once with its default, and the comment its field carries in
    config.py (on its line and the block above it) as its meaning."""
    from orthros.training.config import describe_keys, valid_keys

    lines = describe_keys().splitlines()
    assert [line.split(" = ")[0].strip() for line in lines] == valid_keys()
    by_key = {line.split(" = ")[0].strip(): line for line in lines}
    assert by_key["train.plot"].endswith("# draw output_dir/loss.png after each eval and at the end (orthros plot)")
    assert "# auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32" in by_key["train.precision"]
    assert "rows per micro-batch per process" in by_key["train.micro_batch_size"]  # the block above the field
    assert "#" not in by_key["seed"]  # no comment, none shown
    assert len({line.index("#") for line in lines if "#" in line}) == 1  # one column
