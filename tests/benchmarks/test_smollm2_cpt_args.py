"""benchmarks/smollm2_cpt.py refuses a passkey range with no length in it before any work."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "smollm2_cpt.py"


def _script():
    spec = importlib.util.spec_from_file_location("smollm2_cpt_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_niah_max_below_the_shortest_length_is_refused(tmp_path, capsys):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        _script().main(["run", "--gguf", str(tmp_path / "m.gguf"), "--data", str(tmp_path), "--out", str(out),
                        "--niah-max", "512"])
    assert e.value.code == 2 and "--niah-max 512" in capsys.readouterr().err
    assert not out.exists()


def test_niah_max_is_free_without_the_niah_phase(tmp_path):
    mod = _script()
    ran = []
    mod.run = lambda a: ran.append(a) or 0  # stop before any work: only the argument check is under test
    assert mod.main(["run", "--gguf", "m.gguf", "--data", ".", "--out", str(tmp_path / "o"), "--niah-max", "512",
                     "--phases", "convert,ppl"]) == 0
    assert ran and ran[0].niah_max == 512
