"""Checkpoints load with ``trust_remote_code=True`` alone: in a fresh process that cannot import
``orthros`` (a ``sitecustomize`` blocks it), through the Auto classes, ``pipeline`` and the
``lm_eval --model hf`` command, computing what the package computes. Also the flattening of
the bundler itself, on a synthetic package."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from orthros.evaluation.common import LM_TASKS_DIR, make_tiny_checkpoint
from orthros.models import OrthrosConfig, OrthrosForCausalLM
from orthros.models.remote_code import RemoteCodeError, bundle

IDS = [3, 17, 5, 42, 9, 11, 2, 7, 30, 8, 19, 4, 23, 6, 15, 12, 28, 10, 14, 21]  # > window (16)
AUTO_MAP = {"AutoConfig": "configuration_orthros.OrthrosConfig", "AutoModel": "modeling_orthros.OrthrosModel",
            "AutoModelForCausalLM": "modeling_orthros.OrthrosForCausalLM"}

BLOCKER = '''\
import sys


class _NoOrthros:
    """Test guard: this process must not import the orthros package."""

    def find_spec(self, name, path=None, target=None):
        if name == "orthros" or name.startswith("orthros."):
            raise ModuleNotFoundError(f"blocked by the test: import of {name!r}")
        return None


sys.meta_path.insert(0, _NoOrthros())
'''

NO_ORTHROS = 'assert not [k for k in sys.modules if k == "orthros" or k.startswith("orthros.")], "orthros imported"'


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("remote_env")
    (d / "guard").mkdir()
    (d / "guard" / "sitecustomize.py").write_text(BLOCKER)
    e = dict(os.environ)
    e.update(PYTHONPATH=str(d / "guard"), HF_HOME=str(d / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
             TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return e


def run_python(code: str, env, cwd, *args, timeout=600) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, cwd=cwd, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return r


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("remote") / "ckpt", max_position_embeddings=256)


def package_outputs(path):
    m = OrthrosForCausalLM.from_pretrained(str(path)).eval()
    ids = torch.tensor([IDS])
    with torch.no_grad():
        return m(ids).logits, m.generate(ids, max_new_tokens=6, do_sample=False, use_engine=False)


def test_the_guard_blocks_orthros(env, tmp_path):
    r = subprocess.run([sys.executable, "-c", "import orthros"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode != 0 and "blocked by the test" in r.stderr


def test_save_pretrained_writes_flat_code_and_auto_map(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["auto_map"] == AUTO_MAP
    files = sorted(p.name for p in ckpt.glob("*.py"))
    assert {"configuration_orthros.py", "modeling_orthros.py"} <= set(files)
    for name in files:  # flat: no parent-relative and no orthros imports left
        for node in ast.walk(ast.parse((ckpt / name).read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.level <= 1, (name, ast.unparse(node))
                assert not (node.module or "").startswith("orthros"), (name, ast.unparse(node))
                if node.level == 1 and node.module:
                    assert (ckpt / f"{node.module}.py").is_file(), (name, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("orthros") for a in node.names), name
    # transformers copies exactly what its regex finds: that must be every file written
    from transformers.dynamic_module_utils import get_relative_import_files

    found = {Path(f).name for e in ("modeling_orthros.py", "configuration_orthros.py")
             for f in get_relative_import_files(str(ckpt / e))}
    assert found | {"modeling_orthros.py", "configuration_orthros.py"} == set(files)
    # the config in memory is not changed by saving
    c = OrthrosConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    c.save_pretrained(ckpt.parent / "cfg_only")
    assert "auto_map" not in c.to_dict()
    assert json.loads((ckpt.parent / "cfg_only" / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert (ckpt.parent / "cfg_only" / "modeling_orthros.py").is_file()


LOAD = NO_ORTHROS.join(["""
import json, sys
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, pipeline

torch.set_num_threads(1)
ck, ids, out, resaved = sys.argv[1], torch.tensor([json.loads(sys.argv[2])]), sys.argv[3], sys.argv[4]
cfg = AutoConfig.from_pretrained(ck, trust_remote_code=True)
m = AutoModelForCausalLM.from_pretrained(ck, trust_remote_code=True).eval()
base = AutoModel.from_pretrained(ck, trust_remote_code=True)
assert AutoTokenizer.from_pretrained(ck, trust_remote_code=True)("The river ran").input_ids  # docs/checkpoints.md
with torch.no_grad():
    logits = m(ids).logits
    gen = m.generate(ids, max_new_tokens=6, do_sample=False)
pipe = pipeline("text-generation", model=ck, trust_remote_code=True, device="cpu")
text = pipe("The river ran", max_new_tokens=4, do_sample=False)[0]["generated_text"]
m.save_pretrained(resaved)  # a model loaded through the remote code saves a loadable checkpoint too
m2 = AutoModelForCausalLM.from_pretrained(resaved, trust_remote_code=True).eval()
with torch.no_grad():
    assert torch.equal(m2(ids).logits, logits)

# the checks of checkpoint_files.py in the remote code: a training run's folders are named as such
import shutil
from pathlib import Path

run, checks = Path(sys.argv[5]), []
for step in ("step_00000004", "step_00000008"):  # the newer one a save cut short: no manifest.json
    shutil.copytree(ck, run / "checkpoints" / step)
(run / "checkpoints" / "step_00000004" / "manifest.json").write_text("{}")
(run / "metrics.jsonl").write_text("")
for d in (run, run / "checkpoints"):
    try:
        type(m).from_pretrained(d)
    except ValueError as e:
        checks.append(f"{type(e).__name__} {e}")
""", """
torch.save({"logits": logits, "gen": gen}, out)
print(json.dumps({"config": type(cfg).__module__, "model": type(m).__module__, "base": type(base).__name__,
                  "text": text, "checks": checks}))
"""])


def test_loads_without_orthros_and_computes_what_the_package_computes(ckpt, env, tmp_path, one_thread):
    """Also the remote code's own checks (one fresh process for both, ~6 s of imports each): the checks of
    ``orthros/checkpoint_files.py`` travel in the remote code (``checkpoint_files.py``) with the training run's layout
    they read (``orthros/layout.py``, as the flat ``layout.py``): the remote class's ``from_pretrained``
    names a run's latest complete checkpoint, with no orthros importable."""
    assert {"checkpoint_files.py", "layout.py", "utils.py"} <= {p.name for p in ckpt.glob("*.py")}
    r = run_python(LOAD, env, tmp_path, ckpt, json.dumps(IDS), tmp_path / "out.pt", tmp_path / "resaved",
                   tmp_path / "run")
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["model"].startswith("transformers_modules.") and info["config"].startswith("transformers_modules.")
    assert info["base"] == "OrthrosModel" and info["text"].startswith("The river ran")
    got = torch.load(tmp_path / "out.pt")
    logits, gen = package_outputs(ckpt)
    torch.testing.assert_close(got["logits"], logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(got["gen"], gen)
    latest = tmp_path / "run" / "checkpoints" / "step_00000004"
    assert info["checks"] == [
        f"CheckpointError {tmp_path / 'run'}: no config.json (not a checkpoint directory); it looks like a training "
        f"run: its latest checkpoint is {latest}",
        f"CheckpointError {tmp_path / 'run' / 'checkpoints'}: no config.json (not a checkpoint directory); it is a "
        f"training run's checkpoints folder: its latest checkpoint is {latest}"], info["checks"]

NO_OPTIONAL = BLOCKER + '''
import importlib.machinery


class _NoOptional(importlib.machinery.PathFinder):
    """Test guard: packages the remote code must not need (absent on a CPU or macOS machine) are not found."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in ("triton", "fla", "matplotlib"):
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [_NoOptional if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
'''

LOAD_HUB = NO_ORTHROS.join(["""
import json, sys
import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)
m = AutoModelForCausalLM.from_pretrained("someone/orthros-tiny", trust_remote_code=True).eval()
with torch.no_grad():
    logits = m(torch.tensor([json.loads(sys.argv[1])])).logits
""", """
torch.save(logits, sys.argv[2])
"""])


def test_a_checkpoint_from_the_hub_loads_without_triton_fla_or_matplotlib(ckpt, env, tmp_path, one_thread):
    """A checkpoint from the hub (here its offline cache) has every code file checked by transformers'
    check_imports, not only the two entry files as for a local directory: the flat ops_triton_*.py,
    ops_gdn_fla.py and utils.py made it ImportError 'requires the following packages ...: triton' (fla,
    matplotlib) where those are not installed, though only CUDA with triton ever imports them."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / "models--someone--orthros-tiny"
    shutil.copytree(ckpt, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (tmp_path / "guard").mkdir()
    (tmp_path / "guard" / "sitecustomize.py").write_text(NO_OPTIONAL)
    hub_env = {**env, "PYTHONPATH": str(tmp_path / "guard"), "HF_HOME": str(tmp_path / "hf")}
    run_python(LOAD_HUB, hub_env, tmp_path, json.dumps(IDS), tmp_path / "out.pt")
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), package_outputs(ckpt)[0], rtol=1e-5, atol=1e-5)


LOAD_CUDA = NO_ORTHROS.join(["""
import json, sys
import torch
from transformers import AutoModelForCausalLM

ck, ids, out = sys.argv[1], torch.tensor([json.loads(sys.argv[2])], device="cuda"), sys.argv[3]
m = AutoModelForCausalLM.from_pretrained(ck, trust_remote_code=True, dtype=torch.bfloat16).to("cuda").eval()
with torch.no_grad():
    logits = m(ids).logits.float().cpu()
    gen = m.generate(ids, max_new_tokens=6, do_sample=False).cpu()
""", """
torch.save({"logits": logits, "gen": gen}, out)
print(json.dumps({"triton": sorted(k.rsplit(".", 1)[-1] for k in sys.modules if ".ops_triton" in k)}))
"""])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_remote_code_on_cuda_runs_the_triton_kernels_as_the_package(ckpt, env, tmp_path):
    """On CUDA the flat code's Triton modules (their imports wrapped for transformers' check_imports) load and
    run: the same logits and greedy tokens as the package in bf16."""
    r = run_python(LOAD_CUDA, env, tmp_path, ckpt, json.dumps(IDS), tmp_path / "out.pt")
    assert json.loads(r.stdout.strip().splitlines()[-1])["triton"], "no flat Triton module was imported"
    m = OrthrosForCausalLM.from_pretrained(str(ckpt), dtype=torch.bfloat16).to("cuda").eval()
    ids = torch.tensor([IDS], device="cuda")
    with torch.no_grad():
        logits, gen = m(ids).logits.float().cpu(), m.generate(ids, max_new_tokens=6, do_sample=False).cpu()
    got = torch.load(tmp_path / "out.pt")
    torch.testing.assert_close(got["logits"], logits, rtol=2e-2, atol=2e-2)
    assert torch.equal(got["gen"], gen)


def _lm_eval_command():
    exe = Path(sys.executable).with_name("lm_eval")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "lm_eval"]


def test_lm_eval_hf_model_with_trust_remote_code(ckpt, env, tmp_path):
    """`lm_eval --model hf --model_args pretrained=CKPT,trust_remote_code=True` in a process that
    cannot import orthros, on the shipped offline task: the scores the package gives."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")
    out = tmp_path / "results"
    cmd = _lm_eval_command() + ["--model", "hf", "--model_args", f"pretrained={ckpt},trust_remote_code=True",
                                "--tasks", "orthros_tiny_cloze", "--include_path", str(LM_TASKS_DIR),
                                "--limit", "4", "--device", "cpu", "--batch_size", "1", "--output_path", str(out)]
    r = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(next(out.rglob("results_*.json")).read_text())["results"]["orthros_tiny_cloze"]

    from orthros.evaluation.lm import run_lm_eval

    want = run_lm_eval(ckpt, ["orthros_tiny_cloze"], limit=4, device="cpu")["results"]["orthros_tiny_cloze"]
    assert got["acc,none"] == want["acc,none"] and got["acc_norm,none"] == want["acc_norm,none"]


# ------------------------------------------------------------------ the bundler on a synthetic package
SYNTH = {
    "models/__init__.py": "",
    "models/modeling_x.py": '''\
        """Entry module."""
        from __future__ import annotations

        from ..layers import Thing
        from . import helper as h
        from ..ops.kern import (
            A,
            B,
        )
        from ..ops.sub import mod

        try:
            from ..ops import optional
        except ImportError:  # pragma: no cover
            optional = None


        def lazy():
            from ..ops import lazy_fn
            return lazy_fn()


        def value():
            return Thing().v + h.HELP + A + B + mod.M + optional + lazy()
        ''',
    "models/helper.py": "HELP = 1000\n",
    "layers/__init__.py": "from .thing import Thing\n",
    "layers/thing.py": '''\
        from ..ops import base_fn


        class Thing:
            v = base_fn()
        ''',
    "ops/__init__.py": "from .core import base_fn, lazy_fn, optional\n",
    "ops/core.py": "def base_fn():\n    return 1\n\n\ndef lazy_fn():\n    return 2\n\n\noptional = 4\n",
    "ops/kern.py": "A, B = 8, 16\n",
    "ops/sub/__init__.py": "",
    "ops/sub/mod.py": "M = 32\n",
}


def _synth(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def test_bundle_flattens_any_import_form(tmp_path):
    from transformers.dynamic_module_utils import get_relative_import_files

    root = _synth(tmp_path / "pkg", SYNTH)
    files = bundle([("models", "modeling_x")], root=root)
    assert set(files) == {"modeling_x.py", "models_helper.py", "layers.py", "layers_thing.py", "ops.py",
                          "ops_core.py", "ops_kern.py", "ops_sub_mod.py"}
    flat = tmp_path / "out" / "flatpkg"
    flat.mkdir(parents=True)
    (flat / "__init__.py").write_text("")
    for name, text in files.items():
        (flat / name).write_text(text)
    # transformers' regex scan finds every file (it copies only those)
    assert {Path(f).name for f in get_relative_import_files(str(flat / "modeling_x.py"))} == set(files) - {"modeling_x.py"}
    sys.path.insert(0, str(flat.parent))
    try:
        import flatpkg.modeling_x as mx

        assert mx.value() == 1 + 1000 + 8 + 16 + 32 + 4 + 2
    finally:
        sys.path.remove(str(flat.parent))
        for k in [k for k in sys.modules if k == "flatpkg" or k.startswith("flatpkg.")]:
            del sys.modules[k]


def test_bundle_reads_the_sources_once_until_one_changes(tmp_path, monkeypatch):
    """Every checkpoint of a training run bundled the package anew (~1 s of ast walks a save): the
    bundle is kept per process, and any edit of a source below the root (same size, or a new
    module) is bundled anew."""
    from orthros.models import remote_code

    calls = []
    collect = remote_code.collect
    monkeypatch.setattr(remote_code, "collect", lambda *a: calls.append(a) or collect(*a))
    root = _synth(tmp_path / "pkg", SYNTH)
    first = bundle([("models", "modeling_x")], root=root)
    first["ops_kern.py"] = "changed by the caller"  # a caller's copy: the kept bundle stays as it was
    assert bundle([("models", "modeling_x")], root=root) != first and len(calls) == 1
    (root / "ops/kern.py").write_text("A, B = 9, 16\n")  # the same size
    assert "A, B = 9, 16" in bundle([("models", "modeling_x")], root=root)["ops_kern.py"] and len(calls) == 2
    (root / "ops/extra.py").write_text("E = 1\n")
    (root / "ops/kern.py").write_text("from .extra import E\nA, B = 9, 16\n")
    assert "ops_extra.py" in bundle([("models", "modeling_x")], root=root) and len(calls) == 3


@pytest.mark.parametrize("line, match", [
    ("from .. import something_defined_in_the_root\n", "top-level package"),
    ("import orthros.ops\n", "is not supported"),
    ("from ... import x\n", "beyond the orthros package"),
    ("import numpy; x = 1\n", "on a line of its own"),  # an optional import is put in a try block: x = 1 in it
])
def test_bundle_refuses_imports_it_cannot_flatten(tmp_path, line, match):
    root = _synth(tmp_path / "pkg", {"__init__.py": "something_defined_in_the_root = 1\n", "models/__init__.py": "",
                                     "models/m.py": line})
    with pytest.raises(RemoteCodeError, match=match):
        bundle([("models", "m")], root=root)


LOAD_MANY = NO_ORTHROS.join(["""
import json, sys
import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)
ids = torch.tensor([json.loads(sys.argv[1])])
out = {}
for ck in sys.argv[3:]:
    m = AutoModelForCausalLM.from_pretrained(ck, trust_remote_code=True).eval()
    assert type(m).__module__.startswith("transformers_modules."), type(m).__module__
    with torch.no_grad():
        out[ck] = m(ids).logits
""", """
torch.save(out, sys.argv[2])
"""])


def test_train_convert_and_hybrid_checkpoints_load_without_orthros(env, tmp_path, one_thread):
    from transformers import LlamaConfig, LlamaForCausalLM

    from orthros.conversion.convert import convert_checkpoint
    from orthros.training.cli import main as train_main

    assert train_main(["--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--seq_len", "32",
                       "--grad_accum", "1", "--model.hidden_size", "32", "--model.intermediate_size", "64",
                       "--model.num_hidden_layers", "1", "--model.num_attention_heads", "2", "--eval_sequences", "1",
                       "--threads", "1", "--progress", "false", "--tensorboard", "false"]) == 0
    trained = next((tmp_path / "run" / "checkpoints").glob("step_*"))
    torch.manual_seed(0)
    src = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, max_position_embeddings=128)).save_pretrained(src)
    converted = tmp_path / "converted"
    convert_checkpoint(src, converted, window_size=8, progress=False)
    from orthros.kinds import hybrid_layout  # Orthros-H: GDN layers (their pure-torch path) + Orthros attention

    hybrid = make_tiny_checkpoint(tmp_path / "hybrid", num_hidden_layers=4, **hybrid_layout("orthros-h", 4))
    ids = [i % 64 for i in IDS]
    cks = (trained, converted, hybrid)
    for ck in cks:
        assert json.loads((ck / "config.json").read_text())["auto_map"] == AUTO_MAP
    run_python(LOAD_MANY, env, tmp_path, json.dumps(ids), tmp_path / "out.pt", *cks)
    got = torch.load(tmp_path / "out.pt")
    for ck in cks:
        m = OrthrosForCausalLM.from_pretrained(str(ck)).eval()
        with torch.no_grad():
            want = m(torch.tensor([ids])).logits
        torch.testing.assert_close(got[str(ck)], want, rtol=1e-5, atol=1e-5)


class MyConfig(OrthrosConfig):
    """A user's subclass: the package cannot copy its code."""


def test_a_subclass_defined_elsewhere_saves_without_remote_code(tmp_path):
    c = MyConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    with pytest.warns(UserWarning, match="saving without remote code: .*MyConfig is defined outside"):
        c.save_pretrained(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "auto_map" not in saved
    # transformers gave a subclass without an __init__ a dataclass one that skipped OrthrosConfig's:
    # no window_size, layer_types ... on the config or in config.json, and no model could be built
    assert saved["window_size"] == 128 and saved["layer_types"] == ["orthros_attention"]
    c = MyConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2,
                 window_size=4, attention_mode="swa")
    assert (c.window_size, c.attention_mode, c.layer_types) == (4, "window", ["window_attention"] * 2)
    assert MyConfig.from_pretrained(tmp_path).window_size == 128
    with pytest.raises(ValueError, match="window_size"):
        MyConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                 window_size=0)
    assert OrthrosForCausalLM(c)(torch.tensor([[1, 2, 3, 4, 5]])).logits.shape == (1, 5, 10)


def test_a_config_registered_for_auto_class_saves_the_flat_code(tmp_path, monkeypatch):
    """Issue: after OrthrosConfig.register_for_auto_class() (HF's way to export custom code), saving ran
    transformers' custom_object_save on the package's own file: configuration_orthros.py was overwritten
    by the package's (`from ..kinds import ...`, which cannot load flat) and its scan of that file failed
    (FileNotFoundError: .../orthros/models/.kinds.py) before config.json was written."""
    monkeypatch.setattr(OrthrosConfig, "_auto_class", "AutoConfig")  # what register_for_auto_class() sets
    c = OrthrosConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    c.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert "from .kinds import" in (tmp_path / "configuration_orthros.py").read_text()
    assert c._auto_class == "AutoConfig" and "auto_map" not in c.to_dict()  # the config as it was


def test_a_model_registered_for_auto_class_saves_the_flat_code(tmp_path, monkeypatch):
    """After OrthrosForCausalLM.register_for_auto_class("AutoModelForCausalLM"), model.save_pretrained
    ran transformers' custom_object_save on the package's modeling file before the config was saved:
    it failed (FileNotFoundError: .../orthros/models/.ops.py) and left a directory holding only the
    package's modeling_orthros.py (a helper's finding)."""
    monkeypatch.setattr(OrthrosForCausalLM, "_auto_class", "AutoModelForCausalLM")
    c = OrthrosConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    model = OrthrosForCausalLM(c)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert "from .." not in (tmp_path / "modeling_orthros.py").read_text()  # the flat file, not the package's
    assert model._auto_class == "AutoModelForCausalLM"
    assert torch.equal(OrthrosForCausalLM.from_pretrained(tmp_path).lm_head.weight, model.lm_head.weight)


def test_saving_a_config_to_a_file_is_a_clear_refusal(tmp_path):
    """config.save_pretrained(FILE) wrote the remote code first, so its mkdir raised a bare
    'FileExistsError: [Errno 17] File exists'; then transformers' AssertionError 'should be a directory,
    not a file'; now a ValueError naming save_directory (as the model's save_pretrained)."""
    f = tmp_path / "config.json"
    f.write_text("{}")
    c = OrthrosConfig(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match=r"^save_directory .*config.json is a file, not a directory"):
        c.save_pretrained(f)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"] and f.read_text() == "{}"


class _FakeHub:
    """Stands in for huggingface_hub's HfApi: records the files each commit uploads."""

    def __init__(self):
        self.uploaded = []

    def create_repo(self, repo_id, **kwargs):
        return type("Repo", (), {"repo_id": repo_id})()

    def create_commit(self, repo_id, operations, **kwargs):
        self.uploaded.append(sorted(op.path_in_repo for op in operations))


@pytest.mark.parametrize("how", ["config.save_pretrained", "config.push_to_hub", "model.save_pretrained"])
def test_a_push_to_the_hub_uploads_the_remote_code(tmp_path, monkeypatch, how):
    """config.save_pretrained(d, push_to_hub=True) uploaded config.json alone: the remote code was written
    before transformers listed the folder, so it counted as unchanged, and the pushed repo did not load."""
    import transformers.modeling_utils
    import transformers.utils.hub as hub

    fake = _FakeHub()
    monkeypatch.setattr(hub, "_hf_api", fake)
    card = lambda *a, **k: type("Card", (), {"save": lambda self, path: Path(path).write_text("card\n")})()  # noqa: E731
    # modeling_utils holds its own name for it: unpatched, model.save_pretrained looked the card up on the
    # network (~24 s of retries offline)
    for module in (hub, transformers.modeling_utils):
        monkeypatch.setattr(module, "create_and_tag_model_card", card)
    model = OrthrosForCausalLM(OrthrosConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    if how == "config.save_pretrained":
        model.config.save_pretrained(str(tmp_path / "repo"), push_to_hub=True)
    elif how == "config.push_to_hub":
        model.config.push_to_hub("me/repo")
    else:
        model.save_pretrained(str(tmp_path / "repo"), push_to_hub=True)
    (files,) = fake.uploaded
    assert "config.json" in files and "modeling_orthros.py" in files and "configuration_orthros.py" in files
