"""Training config: YAML + overrides, nearest-key suggestions, validation (no model needed)."""

import re
from pathlib import Path

import pytest

from orthros.training.cli import main as cli_main
from orthros.training.config import ConfigError, dump_yaml, load_config, nearest_key, parse_overrides


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
    # a value forgotten (`--lr --max_steps 4`): the bare flag is true; say so rather than only "got True"
    (["--lr", "--max_steps", "4"], r"'optim.lr' expects float, got True \(an override with no value after it, as "
                                   r"--lr alone, is true: give it one\)"),
])
def test_bad_values_are_refused(args, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(None, args)


def test_override_parsing():
    assert parse_overrides(["--a.b", "1", "--flag", "--c", "x", "--resume", "/p"]) == [
        ("a.b", 1), ("flag", True), ("c", "x"), ("checkpoint.resume", "/p")]
    with pytest.raises(ConfigError, match="expected an override"):
        parse_overrides(["oops"])
    # `orthros train --lr 3e-4 c.yaml`: the file after the overrides was a stray value, nothing more
    with pytest.raises(ConfigError, match=r"got 'c.yaml' \(a config file comes first: orthros train CONFIG.yaml"):
        load_config(None, ["--lr", "3e-4", "c.yaml"])
    # the command's flags written as keys were "unknown config key 'dry_run'" with no word of --dry-run
    for args in (["--dry_run"], ["--dry-run=true"], ["--help_config"]):
        with pytest.raises(ConfigError, match=r"is not a config key: the flag is --(dry-run|help-config)"):
            load_config(None, args)


def test_cli_reports_errors_before_training(capsys, tmp_path):
    assert cli_main(["--optim.learnin_rate", "1"]) == 2
    assert "did you mean 'optim.lr'" in capsys.readouterr().err
    assert cli_main([str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    with pytest.MonkeyPatch.context() as mp:  # README's configs/... run from outside the repository's root
        mp.chdir(tmp_path)
        assert cli_main(["configs/tiny_cpu_pt.yaml"]) == 2
        assert "the shipped configs/ folder is in the repository's root" in capsys.readouterr().err
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


@pytest.mark.parametrize("args,msg", [
    # torch's AdamW refused these only once the model was built (after --dry-run said every check
    # passed), without naming the key; `python -m orthros.train` showed a traceback
    (["--optim.beta1", "1.5"], r"optim.beta1 must be in \[0, 1\), got 1.5"),
    (["--optim.beta2", "-0.1"], r"optim.beta2 must be in \[0, 1\), got -0.1"),
    (["--optim.eps", "-1"], "optim.eps must be > 0"),
    # 0/0 in AdamW's first update of a parameter whose gradient is zero (an untied embedding row of a
    # token not yet seen): the loss went nan at step 2, blamed on optim.lr or the data
    (["--optim.eps", "0"], r"optim.eps must be > 0 \(AdamW divides by sqrt\(v\) \+ eps"),
    (["--model.initializer_range", "-1"], "model.initializer_range must be >= 0"),  # RuntimeError, exit 1
    # nan passed every `> 0` check; a nan grad_clip trained silently
    (["--lr", "nan"], "optim.lr must be a finite number, got nan"),
    (["--optim.grad_clip", "nan"], "optim.grad_clip must be a finite number"),
    (["--optim.weight_decay", "inf"], "optim.weight_decay must be a finite number"),
    (["--model.rope_theta", ".inf"], "model.rope_theta must be a finite number"),
    (["--threads", "-1"], r"train.threads must be >= 1 \(or null"),  # RuntimeError from torch, exit 1
    (["--train.peak_tflops", "-5"], r"train.peak_tflops must be > 0 \(or null"),  # a negative MFU logged
    # numpy's / torch's seeding refused these without naming the key
    (["--seed", "-1"], r"seed must be an integer in \[0, 2\*\*64 - 1\], got -1"),
    (["--seed", str(2 ** 64)], r"seed must be an integer in \[0, 2\*\*64 - 1\]"),
    # a ValueError from the layer layout (a traceback under python -m orthros.train)
    (["--model.architecture", "orthros-h", "--model.num_hidden_layers", "2"],
     r"model.num_hidden_layers must be >= 4 for model.architecture 'orthros-h'"),
    # "a 'gdn' model needs num_layers >= 1", from the layer layout once the trainer built the config
    (["--model.architecture", "gdn", "--model.num_hidden_layers", "0"],
     r"model.num_hidden_layers must be >= 1 for model.architecture 'gdn', got 0"),
    (["--resume="], "checkpoint.resume must be auto, true, false or a checkpoint directory, got ''"),
    # trained with loss 0: a row of one token has no target
    (["--seq_len", "1"], r"data.seq_len must be >= 2 \(a row of one token predicts nothing\), got 1"),
    # 'cannot tell the format of []'
    (["--data.train", "[]"], r"data.train must name a dataset, got \[\]"),
    (["--data.eval", "[]"], r"data.eval must name a dataset \(or be null: no eval\), got \[\]"),
    # an unset shell variable: '' init_from trained from scratch without a word, '' tokenizer failed as a
    # hub repo id, ' ' was YAML's null ("'output_dir' may not be null")
    (["--model.init_from", ""], r"model.init_from is '': name a checkpoint directory or hub model \(null: none\)"),
    (["--data.tokenizer", ""], "data.tokenizer is '': name 'embedded', a tokenizer directory or hub name"),
    (["--output_dir", " "], "output_dir is ' ': name a directory"),
    (["--data.train", "[a.jsonl, ' ']"], "data.train is ' ': name a dataset"),
    (["--data.eval", " "], r"data.eval is ' ': name a dataset \(null: no eval\)"),
    (["--model.head_dim", " "], "'model.head_dim' expects int or null, got ' '"),
    # an item of a list that is no text was read as its str(): 'data file not found: 5', "data glob \"['a']\""
    (["--data.train", "[a.jsonl, 5]"], r"data.train\[1\] must be text \(a file, folder, glob or hub dataset\), got 5"),
    (["--data.eval", "[[a.jsonl]]"], r"data.eval\[0\] must be text \(a file, folder, glob or hub dataset\), "
                                     r"got \['a.jsonl'\]"),
])
def test_bad_values_are_refused_at_load_time(args, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(None, args)


@pytest.mark.parametrize("args", [["--optim.grad_clip", "inf"], ["--optim.grad_clip", "0"], ["--threads", "0"],
                                  ["--seed", str(2 ** 64 - 1)], ["--train.peak_tflops", "0"],
                                  ["--optim.beta1", "0"],
                                  ["--model.architecture", "gdn", "--model.num_hidden_layers", "1"]])
def test_edge_values_that_work_stay_accepted(args):
    load_config(None, args)


def test_dry_run_flag_before_the_config_file(tmp_path, capsys):
    """`orthros train --dry-run CONFIG.yaml`: the file was taken for a stray override."""
    p = tmp_path / "c.yaml"
    p.write_text("mode: rlhf\n")
    assert cli_main(["--dry-run", str(p)]) == 2
    err = capsys.readouterr().err
    assert "mode must be one of" in err and "expected an override" not in err


def test_override_values_yaml_cannot_read_are_taken_as_text():
    """A glob as data.train (`--data.train '*.jsonl'`, a YAML alias) was a ScannerError traceback;
    `--output_dir 'runs/a #2'` lost ' #2' as a YAML comment. Quoting still makes a string."""
    assert parse_overrides(["--data.train", "*.jsonl", "--output_dir", "runs/a #2", "--data.tokenizer", "@tok",
                            "--data.eval", "'2024'", "--lr", "3e-4", "--data.eval", "null # none"]) == [
        ("data.train", "*.jsonl"), ("output_dir", "runs/a #2"), ("data.tokenizer", "@tok"), ("data.eval", "2024"),
        ("lr", "3e-4"), ("data.eval", None)]
    cfg = load_config(None, ["--data.train", "*.jsonl", "--output_dir", "runs/a #2"])
    assert cfg.data.train == "*.jsonl" and cfg.output_dir == "runs/a #2"


@pytest.mark.parametrize("args, msg", [
    # lr_multiplier never reads min_lr_ratio on a constant schedule: the run stayed at the peak lr
    (["--optim.schedule", "constant", "--optim.min_lr_ratio", "0.5"],
     r"optim.min_lr_ratio \(0.5\) is where schedules \['cosine', 'linear'\] end; optim.schedule 'constant'"),
    # the encoder of a mode reads one field: the other was accepted and never read
    (["--mode", "sft", "--data.text_field", "body"],
     r"data.text_field \('body'\) applies to modes \['pt', 'cpt'\]; mode 'sft' reads data.messages_field"),
    (["--data.messages_field", "conversation"],
     r"data.messages_field \('conversation'\) applies to mode \['sft'\]; mode 'pt' reads data.text_field"),
])
def test_keys_another_mode_or_schedule_reads_are_refused(args, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(None, args)


@pytest.mark.parametrize("args", [["--optim.warmup_steps", "50", "--train.max_steps", "10"],
                                  ["--warmup_steps", "8", "--max_steps", "7", "--schedule", "constant"]])
def test_a_warmup_longer_than_the_run_is_refused(args):
    """optim.warmup_steps above train.max_steps was accepted: the run ended inside its warm-up and
    never trained at optim.lr, while the dry run and run_config.yaml said it would. Refused before
    any work, naming both keys; a warm-up as long as the run (and the default 20 on a short run,
    a key left at its default) stays accepted."""
    warm, steps = args[1], args[3]
    with pytest.raises(ConfigError, match=rf"optim.warmup_steps \({warm}\) is more than train.max_steps "
                                          rf"\({steps}\): .* set optim.warmup_steps to at most {steps}"):
        load_config(None, args)
    assert load_config(None, ["--warmup_steps", steps, "--max_steps", steps]).optim.warmup_steps == int(steps)
    assert load_config(None, ["--max_steps", "3"]).optim.warmup_steps == 20


def test_those_keys_at_their_default_stay_accepted(tmp_path):
    """run_config.yaml (every key) may be fed back: a key at its default is never refused, and
    each key is accepted where it applies."""
    cfg = load_config(None, ["--mode", "sft", "--schedule", "constant"])
    p = tmp_path / "run_config.yaml"
    p.write_text(dump_yaml(cfg))
    assert load_config(str(p)).optim.schedule == "constant"
    load_config(None, ["--schedule", "linear", "--min_lr_ratio", "0.5", "--text_field", "body"])
    load_config(None, ["--mode", "sft", "--messages_field", "conversation"])


def test_paths_from_a_yaml_file_expand_the_home_dir(tmp_path, monkeypatch):
    """'~/runs' in a YAML file (no shell expands it) was used as is: output_dir became a folder
    named '~' under the current one, and data.tokenizer passed the check (which expanded it) but
    transformers then refused '~/tok' as a hub id."""
    monkeypatch.setenv("HOME", str(tmp_path))
    p = tmp_path / "c.yaml"
    p.write_text("mode: cpt\noutput_dir: ~/runs/a\nmodel:\n  init_from: ~/ckpt\ndata:\n  tokenizer: ~/tok\n"
                 "checkpoint:\n  resume: ~/runs/a/checkpoints/step_00000004\n")
    cfg = load_config(str(p))
    assert cfg.output_dir == str(tmp_path / "runs/a") and cfg.model.init_from == str(tmp_path / "ckpt")
    assert cfg.data.tokenizer == str(tmp_path / "tok")
    assert cfg.checkpoint.resume == str(tmp_path / "runs/a/checkpoints/step_00000004")
    assert load_config(None, ["--resume"]).checkpoint.resume is True


def test_override_text_that_yaml_reads_as_a_number_is_text_for_a_text_key():
    """`--output_dir 001` was refused as "expects str, got 1" (and `--output_dir yes` as True): YAML
    reads those as numbers / booleans, and the shell leaves no way to quote them. A key that takes
    text keeps the text as typed; a bare flag, a null and the other keys are read as before."""
    cfg = load_config(None, ["--output_dir", "001", "--data.text_field", "0", "--data.tokenizer", "yes"])
    assert (cfg.output_dir, cfg.data.text_field, cfg.data.tokenizer) == ("001", "0", "yes")
    assert load_config(None, ["--data.eval", "1.50"]).data.eval == "1.50"
    assert load_config(None, ["--resume", "7"]).checkpoint.resume == "7"  # a checkpoint folder named 7
    assert load_config(None, ["--resume"]).checkpoint.resume is True
    with pytest.raises(ConfigError, match="'output_dir' expects str, got True"):
        load_config(None, ["--output_dir"])
    with pytest.raises(ConfigError, match="'output_dir' may not be null"):
        load_config(None, ["--output_dir", "null"])
    with pytest.raises(ConfigError, match="'data.seq_len' expects int"):
        load_config(None, ["--seq_len", "yes"])


def test_a_yaml_section_with_every_key_commented_out_is_empty(tmp_path):
    """`model:` with its keys commented out is YAML's null: it was refused as "config section 'model'
    must be a mapping", though an empty file (no section at all) is a valid config."""
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  # hidden_size: 64\ndata:\n  seq_len: 64\n")
    cfg = load_config(str(p))
    assert cfg.model.hidden_size == 128 and cfg.data.seq_len == 64


@pytest.mark.parametrize("text, key, lines", [
    ("optim:\n  lr: 3.0e-3\n  warmup_steps: 5\n  lr: 1.0e-4\n", "lr", "2 and 4"),
    # a section written twice: the second replaced the whole first one (optim.lr fell back to its default)
    ("optim:\n  lr: 3.0e-3\ntrain:\n  max_steps: 9\noptim:\n  warmup_steps: 5\n", "optim", "1 and 5"),
])
def test_a_key_set_twice_in_a_yaml_file_is_refused(tmp_path, text, key, lines):
    """YAML keeps the last of two equal keys without a word: a config that set optim.lr twice, or
    had two optim sections, trained with one of them silently dropped."""
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=rf"config file {p}: '{key}' is set twice \(lines {lines}\)"):
        load_config(str(p))
    p.write_text("optim:\n  <<: {lr: 3.0e-3, warmup_steps: 5}\n  lr: 1.0e-4\n")  # a merge key's override: YAML's rule
    assert (load_config(str(p)).optim.lr, load_config(str(p)).optim.warmup_steps) == (1e-4, 5)


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")
                                        if not p.name.startswith("smollm2_")))
def test_every_shipped_config_loads(name):
    """configs/*.yaml load as they are; cpt.yaml asks for model.init_from by its key (its placeholder
    'REPLACE_WITH_CHECKPOINT_DIR' was taken for a hub model id, which failed on the network)."""
    path = Path(__file__).resolve().parents[2] / "configs" / name
    if name == "cpt.yaml":
        with pytest.raises(ConfigError, match="mode 'cpt' continues pre-training from a checkpoint: set model.init_from"):
            load_config(str(path))
        assert load_config(str(path), ["--model.init_from", "/ckpt/converted"]).model.init_from == "/ckpt/converted"
    else:
        load_config(str(path))


@pytest.mark.parametrize("key", ["--output_dir", "--model.init_from", "--data.tokenizer", "--resume"])
def test_a_home_folder_of_no_user_is_refused_naming_the_key(key, tmp_path, monkeypatch):
    """os.path.expanduser keeps `~nosuchuser9/run` as typed: output_dir became a folder named
    '~nosuchuser9' in the working directory (and --dry-run said all was well)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"^{key.lstrip('-').replace('resume', 'checkpoint.resume')} "
                                          r"~nosuchuser9/x: no user 'nosuchuser9' on this machine"):
        load_config(None, [key, "~nosuchuser9/x"] + (["--mode", "cpt"] if key == "--model.init_from" else []))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, msg", [
    (["--model.hidden_size", "30"], r"^--model.hidden_size 30: model.hidden_size \(30\) must be a multiple of model.num_attention_heads \(4\)"),
    (["--model.hidden_size", "28"], r"^--model.hidden_size 28: model.hidden_size / model.num_attention_heads .* must be even for RoPE .*"
                                    r"got 28 / 4 = 7$"),
    (["--model.num_attention_heads", "2", "--model.head_dim", "7"], r"^--model.head_dim 7: model.head_dim must be even for RoPE"),
])
def test_a_head_size_that_cannot_work_names_the_keys_that_make_it(args, msg):
    """`--model.hidden_size 30` said 'model: OrthrosConfig.head_dim must be even for RoPE, got 7' (a key
    the user never set; 7 = 30 // 4). The keys that make the head size are named now."""
    with pytest.raises(ConfigError, match=msg):
        load_config(None, args)
    load_config(None, ["--model.hidden_size", "132", "--model.head_dim", "16"])  # an explicit head size divides nothing


@pytest.mark.parametrize("kw, msg", [
    (dict(hidden_size=0), r"^model.hidden_size must be an integer >= 1, got 0$"),
    (dict(num_key_value_heads=3), r"^model.num_attention_heads \(4\) must be a multiple of model.num_key_value_heads "
                                  r"\(3\)$"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": -1.0}),
     r"^model.rope_theta must be a finite number > 0, got -1.0$"),
    (dict(attn_backend="cuda"), r"^model.attn_backend must be one of "),
    (dict(vocab_size=0), r"^model: OrthrosConfig.vocab_size must be an integer >= 1"),  # no model.* key sets it
])
def test_an_error_of_the_model_config_names_the_training_key(kw, msg):
    """`orthros train --model.hidden_size 0 --dry-run` said 'model: OrthrosConfig.hidden_size must be an
    integer >= 1', naming the model's field, not the key to change. model_config_error names the key."""
    from orthros.models import OrthrosConfig
    from orthros.training.config import model_config_error

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                window_size=4)
    with pytest.raises(ValueError) as e:
        OrthrosConfig(**{**base, **kw})
    err = model_config_error(e.value)
    assert isinstance(err, ConfigError)
    assert re.match(msg, str(err)), str(err)


def test_the_gdn_layers_sizes_are_training_keys(tmp_path):
    """`orthros train --model.architecture orthros-h` could not size its Gated DeltaNet layers ('unknown
    config key model.linear_num_value_heads'): every hybrid run had as many key / value heads as attention
    heads. The model.linear_* keys reach the model's config; on an attention-only architecture, where they
    would size nothing, they are refused; on a model.init_from checkpoint they are shape keys."""
    from orthros.data import load_tokenizer
    from orthros.training.trainer import model_config_for

    tok = load_tokenizer("embedded")
    sizes = {"linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 16,
             "linear_value_head_dim": 24, "linear_conv_kernel_dim": 3}
    args = ["--model.architecture", "orthros-h"] + [a for k, v in sizes.items() for a in (f"--model.{k}", str(v))]
    mc = model_config_for(load_config(None, args), tok)
    assert {k: getattr(mc, k) for k in sizes} == sizes
    with pytest.raises(ConfigError, match=r"^model.linear_num_value_heads \(4\) must be a multiple of "
                                          r"model.linear_num_key_heads \(3\)$"):
        model_config_for(load_config(None, ["--model.architecture", "gdn", "--model.linear_num_key_heads", "3",
                                            "--model.linear_num_value_heads", "4"]), tok)
    with pytest.raises(ConfigError, match=r"^--model.linear_key_head_dim 16: model.linear_key_head_dim sizes the Gated DeltaNet layers of "
                                          r"model.architecture \['orthros-h', 'linear-hybrid', 'gdn'\]; 'swa' has none"):
        load_config(None, ["--model.architecture", "swa", "--model.linear_key_head_dim", "16"])
    # at their default they stay accepted everywhere (run_config.yaml, every key, may be fed back)
    assert load_config(None, ["--model.architecture", "swa", "--model.linear_conv_kernel_dim", "4"])

    # on a model.init_from checkpoint: shape keys of its GDN layers; one without GDN layers has nothing to size
    # (it was 'the checkpoint has 4', a value that sized nothing)
    from orthros.models import OrthrosConfig
    from orthros.training.config import ModelSection
    from orthros.training.trainer import _apply_model_keys

    base = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                window_size=4)
    with pytest.raises(ConfigError, match=r"^model.linear_conv_kernel_dim sizes Gated DeltaNet layers; the checkpoint "
                                          r"at model.init_from 'ck' has none: drop model.linear_conv_kernel_dim$"):
        _apply_model_keys(ModelSection(init_from="ck", linear_conv_kernel_dim=5), OrthrosConfig(**base))
    hybrid = OrthrosConfig(**base, full_attention_interval=4)
    with pytest.raises(ConfigError, match=r"^model.linear_conv_kernel_dim is 5, but the checkpoint at model.init_from "
                                          r"'ck' has 4"):
        _apply_model_keys(ModelSection(init_from="ck", linear_conv_kernel_dim=5), hybrid)
    _apply_model_keys(ModelSection(init_from="ck", linear_conv_kernel_dim=4, linear_num_key_heads=4), hybrid)


def test_a_config_file_that_is_no_yaml_text_is_named(tmp_path):
    """A config path that is a folder was 'not found', and a file that is not UTF-8 (a binary, a
    Latin-1 file) failed as a bare codec message that named neither the file nor what was wrong."""
    latin = tmp_path / "run.yaml"
    latin.write_bytes(b"mode: pt\noutput_dir: r\xe9sum\xe9\n")
    with pytest.raises(ConfigError, match=re.escape(f"config file {latin} is not UTF-8 text (byte 22)")):
        load_config(str(latin))
    with pytest.raises(ConfigError, match=re.escape(f"config file {tmp_path} is a directory, not a YAML file")):
        load_config(str(tmp_path))


@pytest.mark.parametrize("args,says", [
    # the option as typed (a bare leaf, '-' for '_') and its value, then the key it sets
    (["--max-steps", "abc"], "--max-steps abc: config key 'train.max_steps' expects int, got 'abc'"),
    (["--lr", "fast"], "--lr fast: config key 'optim.lr' expects float, got 'fast'"),
    (["--optim.lr=fast"], "--optim.lr fast: config key 'optim.lr' expects float, got 'fast'"),
    (["--lr", "--max_steps", "4"], "--lr: config key 'optim.lr' expects float, got True (an override with no value "
                                   "after it, as --lr alone, is true: give it one)"),
    # a null, in YAML's word (it said 'int or NoneType')
    (["--model.head_dim", "x"], "config key 'model.head_dim' expects int or null, got 'x'"),
])
def test_a_bad_override_value_names_the_option_as_typed(args, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(None, args)


def test_a_yaml_value_of_the_wrong_type_gives_no_override_hint(tmp_path):
    """`max_steps: true` in a YAML file was told of 'an override with no value after it, as
    --max_steps alone', which the user never wrote."""
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  max_steps: true\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    assert str(e.value) == f"config file {p}: config key 'train.max_steps' expects int, got True"


@pytest.mark.parametrize("text,says", [
    # a misspelt section was matched by its leaf: 'trian' -> 'data.train', 'optm' -> nothing
    ("trian:\n  max_steps: 3\n", "unknown config section 'trian'; did you mean 'train'?"),
    ("optm:\n  lr: 1.0e-3\n", "unknown config section 'optm'; did you mean 'optim'?"),
    ("checkpoints:\n  every: 5\n", "unknown config section 'checkpoints'; did you mean 'checkpoint'?"),
])
def test_a_misspelt_yaml_section_names_the_nearest_section(tmp_path, text, says):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(str(p))


def test_a_section_given_as_an_override_names_its_keys():
    """`--optim 3` was "unknown config key 'optim'; did you mean 'optim.lr'?": a section, not a key."""
    with pytest.raises(ConfigError, match=re.escape("'optim' is a config section, not a key: set one of its keys, "
                                                    "as --optim.lr VALUE")):
        load_config(None, ["--optim", "3"])


@pytest.mark.parametrize("text,says", [
    ("train:\n\tmax_steps: 3\n", "line 2, column 1: found character '\\t' that cannot start any token (indent with "
                                 "spaces: YAML takes no tabs)"),
    ("optim:\n  lr: [1e-3\n", "line 3, column 1: while parsing a flow sequence (line 2, column 7), expected ',' or ']', "
                              "but got '<stream end>'"),
])
def test_a_yaml_syntax_error_is_one_line_naming_the_file_and_line(tmp_path, capsys, text, says):
    """PyYAML's error ran over five lines (the docs promise one) and named '<unicode string>', not the file."""
    p = tmp_path / "c.yaml"
    p.write_text(text)
    assert cli_main([str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == f"orthros train: error: config file {p} is not valid YAML at {says}\n"


def test_stray_command_line_words_say_what_was_meant(tmp_path):
    """A second config file was told 'a config file comes first', after one that did; '-max_steps' (one
    dash) and '--dryrun' (the flag misspelt) named nothing to type instead."""
    p = tmp_path / "c.yaml"
    p.write_text("seed: 1\n")
    with pytest.raises(ConfigError, match=re.escape(f"got 'd.yaml' (one config file only: {p} is the config; "
                                                     "set another's keys as overrides)")):
        load_config(str(p), ["d.yaml"])
    with pytest.raises(ConfigError, match=re.escape("got '-max_steps' (an override takes two dashes: --max_steps)")):
        load_config(None, ["-max_steps", "3"])
    for typo, flag in (("--dryrun", "--dry-run"), ("--dry-runn", "--dry-run"), ("--help_confg", "--help-config")):
        with pytest.raises(ConfigError, match=re.escape(f"unknown config key '{typo[2:]}'; did you mean the flag {flag}?")):
            load_config(None, [typo])
    # a key as typed, '-' and all (it said 'max_stepz' for --max-stepz)
    with pytest.raises(ConfigError, match=re.escape("unknown config key 'max-stepz'; did you mean 'train.max_steps'?")):
        load_config(None, ["--max-stepz", "3"])


@pytest.mark.parametrize("args, says", [
    (["--max-steps", "5", "--max-steps", "7"],
     "train.max_steps is set twice, by --max-steps 5 and by --max-steps 7: give it once"),
    (["--max_steps=5", "--lr", "1e-3", "--train.max_steps", "7"],
     "train.max_steps is set twice, by --max_steps 5 and by --train.max_steps 7: give it once"),
    (["--resume", "--checkpoint.resume", "false"],
     "checkpoint.resume is set twice, by --resume and by --checkpoint.resume false: give it once"),
    (["--lr", "1e-3", "--optim.lr", "2e-3", "--lr", "3e-3"],
     "optim.lr is set twice, by --lr 1e-3 and by --optim.lr 2e-3: give it once"),
])
def test_an_override_given_twice_is_refused_naming_both(tmp_path, args, says):
    """`orthros train --max-steps 5 --max-steps 7` trained 7 steps without a word: the last of two
    overrides of one key won (a value for the config file's key is what an override is for)."""
    with pytest.raises(ConfigError) as e:
        load_config(None, args)
    assert str(e.value).startswith(says), str(e.value)
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  max_steps: 3\n")
    assert load_config(str(p), ["--max-steps", "5"]).train.max_steps == 5  # the file's key, overridden once


def test_an_override_given_twice_is_refused_before_any_work(tmp_path, capsys):
    from orthros.cli import main

    out = tmp_path / "run"
    assert main(["train", "--output_dir", str(out), "--max-steps", "5", "--max-steps", "7"]) == 2
    err = capsys.readouterr().err
    assert "orthros train: error: train.max_steps is set twice, by --max-steps 5 and by --max-steps 7" in err, err
    assert not out.exists()


@pytest.mark.parametrize("args", [["--config", "c.yaml"], ["--config=c.yaml"], ["-c", "c.yaml"],
                                  ["--config_file", "c.yaml"]])
def test_a_config_file_given_as_an_option_says_where_it_goes(tmp_path, capsys, args):
    """`orthros train --config c.yaml` (other trainers' spelling) was "unknown config key 'config'",
    and `-c c.yaml` "config file not found: -c": neither said the file is given by itself, first."""
    from orthros.cli import main

    assert main(["train", *args, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"orthros train: error: {args[0].split('=')[0]}: the config file is given by itself, first: " \
           f"orthros train CONFIG.yaml [--key value ...]" in err, err


def test_a_section_that_is_no_mapping_names_the_file_and_the_value(tmp_path):
    """`train: 5` was "config section 'train' must be a mapping": no file, no value, no keys of it."""
    p = tmp_path / "c.yaml"
    p.write_text("train: 5\n")
    with pytest.raises(ConfigError, match=re.escape(f"config file {p}: section 'train' must be a mapping of its "
                                                    f"keys (train.max_steps: ..., see `orthros train --help-config`), "
                                                    f"got 5")):
        load_config(str(p))


def test_train_help_points_to_the_keys_and_says_an_override_is_given_once(capsys):
    """`orthros train --help` spoke of "the keys below", which it does not list (--help-config does)."""
    from orthros.training.cli import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "keys below" not in out and "--help-config lists them" in out
    assert "override one key, once" in out


@pytest.mark.parametrize("args,says", [
    # outside its choices, and out of range: 'mode must be one of ...' named neither the option nor the value typed
    (["--mode", "xx"], "--mode xx: mode must be one of ['pt', 'sft', 'cpt'], got 'xx'"),
    (["--max-steps", "-5"], "--max-steps -5: train.max_steps must be > 0, got -5"),
    (["--optim.lr", "-1"], "--optim.lr -1: optim.lr must be > 0, got -1.0"),
    (["--data.train", "[a.jsonl, 5]"], "--data.train '[a.jsonl, 5]': data.train[1] must be text"),
])
def test_a_value_out_of_range_or_choices_names_the_option_as_typed(args, says):
    with pytest.raises(ConfigError) as e:
        load_config(None, args)
    assert str(e.value).startswith(says), str(e.value)


def test_a_yaml_value_out_of_range_or_choices_names_the_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("mode: xx\ntrain:\n  max_steps: 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    assert str(e.value) == f"config file {p}: mode must be one of ['pt', 'sft', 'cpt'], got 'xx'"
    p.write_text("train:\n  max_steps: -3\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(p), ["--lr", "1e-3"])
    assert str(e.value) == f"config file {p}: train.max_steps must be > 0, got -3"


def test_an_error_of_two_keys_names_no_file_for_a_key_an_override_did_not_set(tmp_path):
    """The warm-up is the YAML file's, the run's length the override's: the error names both keys; it is not
    said to be the file's."""
    p = tmp_path / "c.yaml"
    p.write_text("optim:\n  warmup_steps: 10\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(p), ["--max-steps", "3"])
    assert str(e.value).startswith("optim.warmup_steps (10) is more than train.max_steps (3)"), str(e.value)
