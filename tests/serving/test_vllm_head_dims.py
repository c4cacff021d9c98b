"""orthros.serving's copy of what the installed vLLM's CPU attention takes. This needs vLLM, so it lives
here, where tests/serving/run_vllm_tests.sh (CI's vLLM step) runs it: in tests/test_info.py it was skipped
in the main environment (no vLLM) and never collected by the vLLM step (tests/serving only)."""

from __future__ import annotations

import os

import pytest

if not os.environ.get("ORTHROS_REQUIRE_VLLM"):  # the vLLM step of CI sets it: there, no vLLM is a failure
    pytest.importorskip("vllm")

from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend  # noqa: E402

from orthros.serving import CPU_ATTENTION_HEAD_DIMS  # noqa: E402


def test_cpu_head_dims_are_vllms():
    """The head dims ``orthros info`` (and the plugin's refusals) name for vLLM's CPU attention are those
    the installed vLLM's backend takes."""
    assert list(CPU_ATTENTION_HEAD_DIMS) == CPUAttentionBackend.get_supported_head_sizes()
