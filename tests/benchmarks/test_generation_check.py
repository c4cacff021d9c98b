"""benchmarks/generation_check.py: generate vs the PT form at a prompt past the window, on a
tiny checkpoint (Orthros and Orthros-H), its refusals, and that a broken decode is caught."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("generation_check_script", ROOT / "benchmarks/generation_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from orthros.evaluation.common import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("gc") / "ckpt", window_size=16, max_position_embeddings=256)


def test_generate_equals_the_pt_form_past_the_window(tiny, tmp_path):
    out = tmp_path / "gc.json"
    assert load_script().main(["--model", str(tiny), "--length", "120", "--new", "4", "--engine", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["ok"] and r["engine_equal"] and len(r["steps"]) == 4 and len(r["new_tokens"]) == 4
    assert r["date"].startswith("20") and r["device"] == "cpu"
    assert all(s["argmax_equal"] and s["max_logit_gap"] < 1e-3 for s in r["steps"])


def test_orthros_h(tmp_path):
    from orthros.evaluation.common import make_tiny_checkpoint

    ck = make_tiny_checkpoint(tmp_path / "h", window_size=16, max_position_embeddings=256, num_hidden_layers=4,
                              layer_types=["linear_attention"] * 3 + ["orthros_attention"],
                              linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                              linear_value_head_dim=8)
    assert load_script().main(["--model", str(ck), "--length", "90", "--new", "3"]) == 0


def test_a_broken_decode_is_caught(tiny, monkeypatch, capsys):
    """Perturb the logits generate returns: the check must fail (exit 1), not pass anything."""
    import transformers

    real = transformers.GenerationMixin.generate

    def broken(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        out.logits = tuple(x + 0.01 for x in out.logits)
        return out

    monkeypatch.setattr(transformers.GenerationMixin, "generate", broken)
    assert load_script().main(["--model", str(tiny), "--length", "60", "--new", "2"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["--length", "1"], "--length must be >= 2"),
    (["--new", "0"], "--new must be in 1..64"),
    (["--atol", "0"], "--atol must be > 0"),
    (["--device", "tpu"], "--device must be cpu"),
    (["--text", "/nonexistent.txt"], "is not a file"),
    # was: found by the write, after the model ran
    (["--out", "{tmp}/f/gc.json"], "--out {tmp}/f/gc.json: {tmp}/f is a file, not a directory"),
])
def test_refusals(tiny, args, message, capsys, tmp_path):
    (tmp_path / "f").write_text("keep")
    with pytest.raises(SystemExit) as e:
        load_script().main(["--model", str(tiny), *(x.format(tmp=tmp_path) for x in args)])
    assert e.value.code == 2 and message.format(tmp=tmp_path) in capsys.readouterr().err


def test_too_long_for_the_model(tiny, capsys):
    assert load_script().main(["--model", str(tiny), "--length", "255", "--new", "3"]) == 2
    err = capsys.readouterr().err
    assert "max_position_embeddings = 256" in err and "--length <= 254" in err, err


def test_at_the_model_maximum_with_the_engine(tiny, tmp_path):
    """The request's last position is the model's last (254 + 3 - 1 = 256 positions: the last new
    token is never fed): was refused by the script's check (255 + 3 > 256 counted one slot too many)
    and, with --engine, by Engine(max_seq_len = length + new + 1) after the whole check had run."""
    out = tmp_path / "gc.json"
    assert load_script().main(["--model", str(tiny), "--length", "254", "--new", "3", "--engine", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["ok"] and r["engine_equal"] and r["length"] == 254
