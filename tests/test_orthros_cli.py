"""The ``orthros`` entry point: a light start (no torch / transformers for --help or --version),
``import orthros`` still registering the model type before transformers' Auto classes are used,
and one exit-code convention for every sub-command (2 bad input, 1 failure while working)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "torch._dynamo", "numpy", "orthros.engine", "orthros.training", "orthros.models",
         "orthros.ops", "orthros.conversion")


def py(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def loaded_after_each(codes: list) -> list:
    """For each code in turn, run in one fresh interpreter: the HEAVY modules loaded after it (a module loaded
    by one is loaded after every later one too: a case that loads one fails whatever follows it)."""
    show = f"import sys, json\nprint(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))\n"
    r = py("".join(code + "\n" + show for code in codes))
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.strip().splitlines()[-len(codes):]]


HELP_AND_VERSION = [
    "import orthros.cli",
    "import orthros",
    "import contextlib, io\nfrom orthros.cli import main\nwith contextlib.redirect_stdout(io.StringIO()): main(['--help'])",
    "import contextlib, io\nfrom orthros.cli import main\nwith contextlib.redirect_stdout(io.StringIO()): main(['--version'])",
    "import contextlib, io\nfrom orthros.cli import main\nwith contextlib.redirect_stderr(io.StringIO()): main(['nosuch'])",
]


def test_help_and_version_import_nothing_heavy():
    """Issue 17 #3: every command took ~6 s to start (``import orthros`` pulled in torch._dynamo
    and more). Timing is measured in docs, not asserted; what is asserted is what gets imported.
    (All the cases in one fresh interpreter, in turn: the first to load a heavy module is named.)"""
    for code, loaded in zip(HELP_AND_VERSION, loaded_after_each(HELP_AND_VERSION)):
        assert loaded == [], (code, loaded)


SUBCOMMAND_HELP = [["train", "--help"], ["train", "--help-config"], ["eval", "--help"], ["eval", "mqar", "--help"],
                   ["eval", "niah-train", "--help"], ["demo", "--help"], ["plot", "--help"], ["info", "--help"],
                   ["fetch", "--help"], ["convert", "--help"], ["generate", "--help"], ["help", "generate"]]


def test_subcommand_help_needs_no_torch():
    """(Every sub-command's help in one fresh interpreter, in turn: the first to import torch or
    transformers is named.)"""
    codes = [("import contextlib, io\nfrom orthros.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
              f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass") for argv in SUBCOMMAND_HELP]
    for argv, loaded in zip(SUBCOMMAND_HELP, loaded_after_each(codes)):
        assert [m for m in loaded if m in ("torch", "transformers")] == [], (argv, loaded)


# input refused with exit 2 and one line before torch or transformers load (seconds on a small machine):
# (argv, the line's start); {d} is a scratch folder (refused.py below)
REFUSED_BEFORE_TORCH = [
    (["info", "{d}/nosuch"], "orthros info: error: PATH {d}/nosuch: no such directory"),
    (["info", "{d}/file.txt"], "orthros info: error: PATH {d}/file.txt: not a directory"),
    (["info", "{d}/empty"], "orthros info: error: PATH {d}/empty: no config.json"),
    (["info", "{d}/llama"], "orthros info: error: PATH {d}/llama: model_type 'llama' is not an Orthros checkpoint"),
    (["info", "{d}/bare"], "orthros info: error: PATH {d}/bare: no weights"),
    (["info", "{d}/ckpt", "--verify"], "orthros info: error: --verify: {d}/ckpt has no manifest.json"),
    (["generate", "--model", "{d}/nosuch", "hi"], "orthros generate: error: --model {d}/nosuch: no such directory"),
    (["generate", "--model", "{d}/file.txt", "hi"], "orthros generate: error: --model {d}/file.txt: not a directory"),
    (["generate", "--model", "{d}/empty", "hi"], "orthros generate: error: --model {d}/empty: no config.json"),
    (["generate", "--model", "{d}/bare", "hi"], "orthros generate: error: --model {d}/bare: no tokenizer files"),
    (["generate", "--model", "{d}/ckpt", "--tokenizer", "{d}/nosuch", "hi"],
     "orthros generate: error: --tokenizer {d}/nosuch: no such directory"),
    (["generate", "--model", "{d}/ckpt", "--device", "cuda:x", "hi"],
     "orthros generate: error: --device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
    (["generate", "--model", "{d}/ckpt", "--dtype", "int8", "hi"], "orthros generate: error: --dtype must be one of"),
    (["train", "{d}/nosuch.yaml"], "orthros train: error: config file not found: {d}/nosuch.yaml"),
    (["train", "{d}/empty"], "orthros train: error: config file {d}/empty is a directory"),
    (["eval", "niah", "--model", "{d}/nosuch"], "orthros eval niah: error: --model {d}/nosuch: no such file"),
    (["eval", "ppl", "--model", "{d}/llama", "--data", "{d}/nosuch.txt"],
     "orthros eval ppl: error: --data {d}/nosuch.txt: no such file"),
    (["eval", "mqar", "--steps", "0"], "orthros eval mqar: error: --steps must be >= 1, got 0"),
    (["eval", "mqar", "--device", "cuda:x"], "orthros eval mqar: error: --device must be cpu, cuda or cuda:N"),
    (["bench", "prefill", "--device", "cuda:x"], "orthros bench: error: --device must be cpu, cuda or cuda:N"),
    (["bench", "decode", "--device", "cpu", "--model", "{d}/nosuch", "--out", "{d}/out"],
     "orthros bench: error: --model {d}/nosuch: no such directory"),
    (["bench", "decode", "--device", "cpu", "--model", "{d}/empty", "--out", "{d}/out"],
     "orthros bench: error: --model {d}/empty: no config.json"),
    (["bench", "decode", "--device", "cpu", "--model", "{d}/llama", "--out", "{d}/out"],
     "orthros bench: error: --model {d}/llama: model_type 'llama' is not an Orthros checkpoint"),
    (["convert", "{d}/nosuch", "{d}/out"], "orthros convert: error: source directory '{d}/nosuch' does not exist"),
    (["convert", "{d}/empty", "{d}/out"], "orthros convert: error: source '{d}/empty' has no config.json"),
    (["convert", "{d}/file.txt", "{d}/out"], "orthros convert: error: source '{d}/file.txt' is not a directory"),
    (["convert", "{d}/bert", "{d}/out"], "orthros convert: error: cannot convert architecture 'BertModel'"),
    (["convert", "--dry-run", "{d}/quant", "{d}/out"],
     "orthros convert: error: {d}/quant/config.json: a quantized checkpoint"),
]


def test_input_needing_no_model_is_refused_before_torch_loads(tmp_path):
    """A wrong path or value that needs no model took seconds to refuse (`orthros info /no/such` 7 s,
    `generate --model /no/such` 5 s, `convert /no/such DST` 6.5 s, `bench decode --model /no/such`
    4.5 s, `train /no/such.yaml` 1.5 s on 2 cores): torch, transformers
    and orthros.models loaded first. Every case in one fresh interpreter, in turn: exit 2, its one
    line, and neither torch nor transformers loaded (the first case to load one is named)."""
    d = tmp_path
    (d / "file.txt").write_text("x")
    (d / "empty").mkdir()
    for name, mt in (("llama", "llama"), ("bare", "orthros"), ("ckpt", "orthros")):
        (d / name).mkdir()
        (d / name / "config.json").write_text(json.dumps({"model_type": mt}))
    (d / "ckpt" / "model.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}")  # a complete, empty one
    (d / "ckpt" / "tokenizer.json").write_text("{}")
    for name, cfg in (("bert", {"model_type": "bert", "architectures": ["BertModel"]}),
                      ("quant", {"model_type": "llama", "quantization_config": {"quant_method": "gptq"}})):
        (d / name).mkdir()
        (d / name / "config.json").write_text(json.dumps(cfg))
    cases = [([a.format(d=d) for a in argv], line.format(d=d)) for argv, line in REFUSED_BEFORE_TORCH]
    code = (f"import contextlib, io, json, sys\nfrom orthros.cli import main\nfor argv in {[a for a, _ in cases]!r}:\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):\n"
            "        rc = main(argv)\n"
            "    print(json.dumps([rc, err.getvalue(), [m for m in ('torch', 'transformers') if m in sys.modules]]))\n")
    r = py(code)
    assert r.returncode == 0, r.stderr[-3000:]
    for (argv, line), out in zip(cases, r.stdout.strip().splitlines()[-len(cases):]):
        rc, err, loaded = json.loads(out)
        assert (rc, loaded) == (2, []) and err.startswith(line) and err.count("\n") == 1, (argv, rc, err, loaded)
    assert not (d / "out").exists()  # (bench's --out and convert's DST)


def test_version_and_help_output():
    from orthros.cli import main

    r = subprocess.run([sys.executable, "-m", "orthros", "--version"], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().startswith("orthros ")
    assert main(["--help"]) == 0
    from orthros.benchmarks.cli import build_parser
    from orthros.cli import _usage

    # the usage's line of `bench` names what it measures: it said "prefill / end-to-end", no decode
    bench = next(a for a in build_parser()._actions if a.choices).choices
    line = next(line for line in _usage().splitlines() if line.startswith("  bench "))
    assert all(what.replace("e2e", "end-to-end") in line for what in bench if what != "all"), line


def test_a_command_group_alone_prints_its_help(capsys):
    """`orthros` and `orthros eval` alone print their help and exit 0; `orthros bench` alone exited 2
    with 'the following arguments are required: what' (an argument name the help never shows)."""
    from orthros.cli import main

    for group, sub in (("eval", "mqar"), ("bench", "prefill")):
        capsys.readouterr()
        assert main([group]) == 0, group
        out = capsys.readouterr().out
        assert out.startswith(f"usage: orthros {group}") and sub in out, out


def test_bench_points_to_the_benchmarks_that_are_their_own_commands(capsys):
    """`orthros bench parallel` failed with 'argument what: invalid choice' (a name the help never
    shows) and the help did not say where the parallel, vLLM and roofline benchmarks are."""
    from orthros.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "parallel"])
    assert e.value.code == 2
    assert "argument COMMAND: invalid choice: 'parallel'" in capsys.readouterr().err
    assert main(["bench"]) == 0
    out = capsys.readouterr().out
    assert "usage: orthros bench [-h] COMMAND" in out
    for command in ("-m orthros.parallel.bench", "-m orthros.serving.bench_vllm", "benchmarks/roofline.py"):
        assert command in out, command


def test_public_names_load_on_first_use():
    out = py("import orthros, sys\n"
             "assert 'torch' not in sys.modules\n"
             "from orthros import OrthrosConfig\n"
             "m = orthros.OrthrosForCausalLM\n"
             "assert m.__name__ == 'OrthrosForCausalLM' and orthros.orthros_attention.__name__\n"
             "assert 'OrthrosCache' in dir(orthros) and orthros.models.OrthrosConfig is OrthrosConfig\n"
             "try:\n    orthros.no_such_name\nexcept AttributeError as e:\n    print('AE', e)\n"
             "import orthros.models.modeling_orthros as mo\n"
             "print('engine', mo._GENERATE_BACKEND is not None)\n")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "AE module 'orthros' has no attribute 'no_such_name'" in out.stdout
    assert "engine True" in out.stdout  # importing the models registers the engine behind generate()


def test_register_registers_the_engine_whatever_came_first():
    """``orthros.register()`` registers the engine behind ``generate()`` "now", also when
    ``orthros.engine`` (lazy since 869e9c5) was imported before the models: importing an imported
    package again runs nothing, so the engine stayed unregistered until generate()'s first call."""
    out = py("import orthros.engine\nimport orthros\northros.register()\n"
             "import orthros.models.modeling_orthros as mo\nprint('engine', mo._GENERATE_BACKEND is not None)\n")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "engine True" in out.stdout


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import torch

    from orthros.models import OrthrosConfig, OrthrosForCausalLM

    d = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    OrthrosForCausalLM(OrthrosConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=64, window_size=8)).save_pretrained(d)
    return d


@pytest.mark.parametrize("order", ["orthros_first", "transformers_first", "auto_config_only"])
def test_import_orthros_registers_the_auto_classes(checkpoint, order):
    """``import orthros`` is lazy, but the Auto classes know "orthros" by the time they are used,
    whichever of orthros / transformers is imported first (the registration is deferred to the
    first AutoConfig lookup)."""
    head = {"orthros_first": "import orthros\nfrom transformers import AutoModelForCausalLM, AutoConfig\n",
            "transformers_first": "from transformers import AutoModelForCausalLM, AutoConfig\nimport orthros\n",
            "auto_config_only": "import orthros\nfrom transformers import AutoConfig\n"}[order]
    body = ("c = AutoConfig.from_pretrained(P)\nprint('config', type(c).__name__)\n" if order == "auto_config_only" else
            "m = AutoModelForCausalLM.from_pretrained(P)\nprint('model', type(m).__name__)\n"
            "import orthros.models.modeling_orthros as mo\nprint('engine', mo._GENERATE_BACKEND is not None)\n")
    # the deferral is undone after the first call (the model's load makes it): AutoConfig's own methods are back
    # (in the same interpreter: each fresh one spends seconds importing torch and transformers)
    undone = "print('own', AutoConfig.__dict__['from_pretrained'].__func__.__module__)\n"
    r = py(f"P = {str(checkpoint)!r}\n" + head + body + undone)
    assert r.returncode == 0, r.stderr[-3000:]
    if order == "auto_config_only":
        assert "config OrthrosConfig" in r.stdout
    else:
        assert "model OrthrosForCausalLM" in r.stdout and "engine True" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "own transformers.models.auto.configuration_auto", r.stdout


# --------------------------------------------------------------------------- exit codes

BAD_INPUT = [
    ["nosuchcommand"],
    ["bench", "prefill", "--device", "cpu", "--systems", "orthros,bogus"],
    ["bench", "decode", "--device", "cpu", "--chunk", "0"],
    # was: measured and written, positions far beyond the model's (prefill's --lengths were refused)
    ["bench", "decode", "--device", "cpu", "--preset", "tiny", "--contexts", "65530", "--steps", "7", "--batch-sizes",
     "1", "--out", "/tmp/orthros-never-written"],
    ["bench", "prefill", "--device", "cpu", "--preset", "tiny", "--lengths", "8", "--budget-s", "-1", "--out",
     "/tmp/orthros-never-written"],  # was: taken as 0
    ["bench", "prefill", "--device", "cpu", "--preset", "tiny", "--lengths", "8", "--single-shot-s", "nan", "--out",
     "/tmp/orthros-never-written"],
    ["info", "/nonexistent/model"],
    ["train", "--no_such_key", "1"],
    ["train", "--lr", "-1"],
    ["eval", "mqar", "--steps", "0"],
    ["eval", "mqar", "--fill", "bogus"],  # argparse
    ["eval", "niah-train", "--out", "/tmp/x", "--steps", "0"],
    ["eval", "niah", "--model", "/nonexistent/model", "--no-progress"],
    ["demo", "--device", "nonsense"],
    ["demo", "--bogus"],  # argparse
    ["convert", "/nonexistent/src", "/tmp/never-written"],
    ["generate", "--model", "/nonexistent/model", "hello"],
]


@pytest.mark.parametrize("argv", BAD_INPUT, ids=lambda a: " ".join(a[:3]))
def test_bad_input_exits_2(argv, capsys):
    from orthros.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own usage errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err, err


def test_failure_while_working_exits_1(tmp_path, capsys):
    """A run that starts and then fails (here the loss diverges) exits 1 with one line."""
    from orthros.cli import main

    rc = main(["train", "--output_dir", str(tmp_path / "run"), "--max_steps", "30", "--seq_len", "32",
               "--grad_accum", "1", "--model.hidden_size", "32", "--model.intermediate_size", "64",
               "--model.num_hidden_layers", "1", "--model.num_attention_heads", "2", "--eval_sequences", "0",
               "--threads", "1", "--progress", "false", "--tensorboard", "false", "--lr", "1e6",
               "--warmup_steps", "0", "--grad_clip", "0", "--checkpoint.every", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1, err[-5:]
    assert err[-1].startswith("orthros train: error: FloatingPointError: loss is "), err[-3:]


def test_refused_training_config_leaves_no_output_dir(tmp_path, capsys):
    """Issue 17 #9: a config refused in the preflight left an empty output directory."""
    from orthros.cli import main

    out = tmp_path / "deep" / "run"
    rc = main(["train", "--output_dir", str(out), "--seq_len", "64", "--model.max_position_embeddings", "32"])
    assert rc == 2 and "data.seq_len (64) is larger" in capsys.readouterr().err
    assert not (tmp_path / "deep").exists()


def test_every_option_of_the_orthros_commands_has_help():
    """`orthros <cmd> --help` describes every option (several showed only `--steps STEPS`)."""
    import ast

    from orthros.cli import COMMANDS

    files = {REPO / (mod.replace(".", "/") + ".py") for mod, _ in COMMANDS.values()}
    files |= {REPO / "orthros" / p for p in ("evaluation/demo.py", "evaluation/niah_train.py", "parallel/bench.py",
                                              "serving/bench_vllm.py")}  # the last two: torchrun / python -m
    files |= set((REPO / "orthros" / "data").glob("build_*.py"))  # `python -m orthros.data.build_*` (its README)
    bare = []
    for f in sorted(files):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" \
                    and "help" not in {k.arg for k in node.keywords}:
                names = [a.value for a in node.args if isinstance(a, ast.Constant)]
                if names != ["train_args"]:  # `orthros train`'s pass-through: its USAGE text says it all
                    bare.append(f"{f.relative_to(REPO)}:{node.lineno} {names}")
    assert len(files) >= 14 and not bare, bare


def test_transformers_bars_stay_out_of_logs(tmp_path):
    """With stderr a file or a pipe, transformers' own bars (here "Loading weights" of
    ``from_pretrained``) would fill a log with carriage returns; ``orthros`` turns them off."""
    from orthros.evaluation.common import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", max_position_embeddings=64)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
    r = subprocess.run([sys.executable, "-m", "orthros", "generate", "--model", str(ckpt), "--max-new-tokens", "2",
                        "--device", "cpu", "hello"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\r" not in r.stderr and "Loading weights" not in r.stderr, r.stderr


def test_an_unknown_option_is_named_with_its_sub_command(capsys):
    from orthros.cli import main

    with pytest.raises(SystemExit) as e:
        main(["eval", "mqar", "--modesl", "x"])
    assert e.value.code == 2
    assert "orthros eval mqar: error: unrecognized arguments: --modesl x" in capsys.readouterr().err


def test_a_failure_an_eval_sub_command_leaves_to_main_names_it(capsys, monkeypatch):
    """A runtime failure of `orthros eval mqar` said `orthros eval: error: ...`, where its own errors (and its
    bad input) say `orthros eval mqar: error: ...`."""
    import orthros.evaluation.cli as ecli
    from orthros.cli import main

    def disk_full(a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ecli, "_mqar", disk_full)
    assert main(["eval", "mqar"]) == 1
    assert capsys.readouterr().err.startswith("orthros eval mqar: error: OSError: [Errno 28] No space left")


@pytest.mark.parametrize("argv", [["--help"], ["info", "--help"], ["info", "CKPT"],
                                  ["convert", "LLAMA", "NEW", "--dry-run", "--window-size", "8"]],
                         ids=["help", "info-help", "info", "convert-dry-run"])
def test_a_reader_that_stops_early_is_no_error(argv, checkpoint, tmp_path):
    """``orthros --help | head -1``: the usage was a BrokenPipeError traceback, ``orthros info X |
    head`` "error: BrokenPipeError" and exit 1, ``orthros convert --dry-run ... | head`` "error:
    [Errno 32] Broken pipe", ``orthros info --help`` exit 0 (argparse drops a failed write). A
    closed stdout ends the command quietly with 141 (128 + SIGPIPE, as a shell's tools exit)."""
    if "LLAMA" in argv:
        from transformers import LlamaConfig, LlamaForCausalLM

        LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
                         ).save_pretrained(tmp_path / "llama")
    paths = {"CKPT": str(checkpoint), "LLAMA": str(tmp_path / "llama"), "NEW": str(tmp_path / "new")}
    argv = [paths.get(a, a) for a in argv]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "orthros", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=REPO, text=True)
    p.stdout.close()  # before the command prints anything: it starts in a fraction of a second at best
    err = p.stderr.read()
    assert p.wait(timeout=300) == 141 and err == "", err


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["info", "--help"], ["eval", "mqar", "--help"],
                                  ["plot", "--help"]])
def test_a_stdout_that_cannot_be_written_is_one_line(argv):
    """``orthros --help > /dev/full``: a disk error is exit code 1 and one line, as for every
    command; the usage and the version were printed outside the handler (an OSError traceback).
    ``orthros info --help > /dev/full`` exited 0 with nothing on stderr (argparse drops a failed
    write of its help)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ORTHROS_TRACEBACK", None)
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "orthros", *argv], stdout=full, stderr=subprocess.PIPE, text=True,
                           env=env, cwd=REPO, timeout=120)
    prog = "orthros" if argv[0].startswith("-") else " ".join(["orthros", *argv[:2 if argv[0] == "eval" else 1]])
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"{prog}: error: OSError: [Errno 28] No space left on device (ORTHROS_TRACEBACK=1 shows the traceback)"], r.stderr


def test_a_tilde_after_an_equals_sign_is_the_home_folder(tmp_path, monkeypatch, capsys):
    """``orthros plot RUN --output=~/p.png``: the shell expands ``~`` only at a word's start, so the
    command got ``~/p.png`` and wrote ``./~/p.png`` (a folder named ``~``) while some commands
    checked the path at the home folder. The dispatcher expands ``--opt=~/...`` and ``-o~/...``
    as the shell does ``--opt ~/...`` (not after ``--``, not ``~`` inside a value)."""
    from orthros.cli import expand_user_options, main

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    assert expand_user_options(["--out=~/x", "-o~/y", "--out=~", "--a=x~/z", "--a=~nosuchuser9/q", "~/p", "--",
                                "--out=~/x"]) == [
        f"--out={home}/x", f"-o{home}/y", f"--out={home}", "--a=x~/z", "--a=~nosuchuser9/q", "~/p", "--", "--out=~/x"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "tokens": 8, "loss": 3.0}\n')
    monkeypatch.chdir(tmp_path)
    assert main(["plot", str(run), "--output=~/p.png"]) == 0
    assert (home / "p.png").is_file() and not (tmp_path / "~").exists()
    assert f"wrote {home}/p.png" in capsys.readouterr().out


@pytest.mark.parametrize("rank, printed", [(None, True), ("0", True), ("1", False)])
def test_an_interrupt_is_reported_once_under_torchrun(monkeypatch, capsys, rank, printed):
    """torchrun passes Ctrl-C to every rank: each printed 'orthros train: interrupted'; rank 0 alone does."""
    import orthros.cli as cli

    def main(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: type("M", (), {"main": staticmethod(main)}))
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert cli._main(["train"]) == 130
    assert ("orthros train: interrupted" in capsys.readouterr().err) is printed


@pytest.mark.parametrize("typed, hint", [
    ("genrate", "did you mean `generate`?"),  # a typo
    ("INFO", "did you mean `info`?"),  # capitals: difflib found nothing
    ("gen", "did you mean `generate`?"),  # a prefix: difflib found nothing
    ("download", "did you mean `fetch`?"),  # another tool's word for a command
    ("finetune", "did you mean `train`?"),
    ("serve", "docs/serving.md"),  # vLLM serves the checkpoints, not an orthros command
    ("HELP", "did you mean `help`?"),  # `help` is a command too (it said nothing)
    ("hlep", "did you mean `help`?"),
    ("version", "did you mean `orthros --version`?"),  # an option, not a command
])
def test_an_unknown_command_names_the_one_meant(typed, hint, capsys):
    from orthros.cli import main

    assert main([typed]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"orthros: error: unknown command {typed!r}") and hint in first, first


def test_an_option_before_the_command_is_named_as_an_option(capsys):
    """``orthros --json info X`` said "unknown command '--json'": options go after the command."""
    from orthros.cli import main

    assert main(["--json", "info", "X"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("orthros: error: unknown option '--json'") and "orthros info --json" in first, first


def test_help_as_a_command(capsys):
    """``orthros help`` (git's, pip's, cargo's way) was an unknown command; ``orthros help info``
    is ``orthros info --help``."""
    from orthros.cli import _usage, main

    assert main(["help"]) == 0 and capsys.readouterr().out.strip() == _usage()
    with pytest.raises(SystemExit) as e:
        main(["help", "info"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: orthros info")
    assert main(["help", "nosuch"]) == 2 and "unknown command 'nosuch'" in capsys.readouterr().err


def test_an_unknown_command_exits_2_when_stderr_is_gone():
    """``orthros bogus 2>&1 >/dev/null | head -1``: the reader of stderr went away after the
    error's first line, and the usage's lines after it raised BrokenPipeError: exit code 1 (a
    traceback nobody saw). Bad input exits 2 whatever becomes of its message, as argparse's."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ORTHROS_TRACEBACK", None)
    p = subprocess.Popen([sys.executable, "-m", "orthros", "bogus"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env, cwd=REPO)
    p.stderr.close()  # before the command prints anything
    assert p.wait(timeout=120) == 2


@pytest.mark.parametrize("argv, named", [(["info", "~nosuchuser9/ckpt"], "~nosuchuser9/ckpt"),
                                          (["plot", "RUN", "--output=~nosuchuser9/x.png"], "~nosuchuser9/x.png")])
def test_a_home_folder_of_no_user_is_bad_input(argv, named, tmp_path, capsys):
    """``orthros info ~bbo/ckpt`` (a typo of ``~bob``: the shell leaves it as typed) was pathlib's
    ``RuntimeError: Could not determine home directory.``, exit 1, naming no path, in every
    command. It is bad input: exit 2, one line naming the path and the user."""
    pwd = pytest.importorskip("pwd")
    from orthros.cli import main

    with pytest.raises(KeyError):
        pwd.getpwnam("nosuchuser9")
    try:
        rc = main([str(tmp_path) if a == "RUN" else a for a in argv])
    except SystemExit as e:  # an option's own check (argparse's usage, then its error line)
        rc = e.code
    assert rc == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # the path's argument named too (utils.expand_path)
    assert last.startswith(f"orthros {argv[0]}: error: ") and f"{named}: no user 'nosuchuser9'" in last, last


@pytest.mark.parametrize("argv", [["eval", "mqar"], ["bench", "decode"]])
def test_help_as_a_command_reaches_a_sub_command(argv, capsys):
    """``orthros help eval mqar`` printed ``orthros eval --help`` (the sub-command dropped without a
    word), where ``orthros eval mqar --help`` gives mqar's options: the README says ``orthros help
    CMD`` says the same as ``--help``."""
    from orthros.cli import main

    with pytest.raises(SystemExit) as e:
        main(["help", *argv])
    assert e.value.code == 0 and capsys.readouterr().out.startswith(f"usage: orthros {' '.join(argv)} ")
