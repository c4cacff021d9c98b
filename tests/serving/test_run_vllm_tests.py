"""``tests/serving/run_vllm_tests.sh``'s pytest command, with a stand-in venv (a ``python`` that
records its arguments), so no install and no vLLM are needed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).with_name("run_vllm_tests.sh")


def pytest_args(tmp_path, *args) -> list:
    """The arguments the script passed to ``python -m pytest`` for ``args``."""
    log = tmp_path / "calls"
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> {log}\n')
    python.chmod(0o755)
    subprocess.run(["bash", str(SCRIPT), *args], check=True, capture_output=True, timeout=60,
                   env={**os.environ, "ORTHROS_VLLM_VENV": str(python.parent.parent)})
    calls = [line.split() for line in log.read_text().splitlines() if line.startswith("-m pytest")]
    assert len(calls) == 1, calls
    return calls[0][2:]


FOLDER = ["-o", "testpaths=tests/serving"]  # pytest's folder when no test path is given (pyproject's: tests)


def test_a_test_path_given_runs_that_alone(tmp_path):
    """The script ran ``pytest tests/serving ARGS``: a file given (the way to run one module, as
    its comment says arguments go to pytest) ran the whole folder with it, minutes of vLLM engines.
    Now tests/serving is pytest's testpaths, which it takes only where no test path is given."""
    assert pytest_args(tmp_path / "a") == [*FOLDER, "-p", "no:cacheprovider"]
    assert pytest_args(tmp_path / "b", "-q", "-x") == [*FOLDER, "-p", "no:cacheprovider", "-q", "-x"]
    one = "tests/serving/test_bench_vllm.py"
    assert pytest_args(tmp_path / "c", "-q", one) == [*FOLDER, "-p", "no:cacheprovider", "-q", one]
    assert pytest_args(tmp_path / "d", f"{one}::test_quick_presets_only_the_sizes_not_given", "-k", "quick") == [
        *FOLDER, "-p", "no:cacheprovider", f"{one}::test_quick_presets_only_the_sizes_not_given", "-k", "quick"]


def test_an_option_value_that_names_a_path_is_no_test_path(tmp_path):
    """``-k orthros`` (or ``-k docs``): the value names a folder of the repository, which the script
    took for a test path, so pytest ran without tests/serving, over the whole tests folder
    (pyproject's testpaths) in the vLLM venv. The same for ``--deselect`` / ``--ignore`` of a
    serving test (the way to skip one module), after the script had learnt to take only paths
    inside tests/: the script no longer guesses, pytest itself parses its arguments."""
    for i, args in enumerate((["-k", "orthros"], ["-k", "docs"],
                              ["--deselect", "tests/serving/test_vllm_server.py::test_chat"],
                              ["--ignore", "tests/serving/test_vllm_hybrid.py"])):
        assert pytest_args(tmp_path / str(i), *args) == [*FOLDER, "-p", "no:cacheprovider", *args]
