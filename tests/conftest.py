"""Test-session setup shared by every test module.

Without CUDA, the Triton kernels run through the Triton interpreter. ``TRITON_INTERPRET`` must
be set before the first ``@triton.jit`` function is created, i.e. before any module (not only
the kernel tests) imports ``orthros.ops.triton``; setting it here, before collection, makes
the kernel tests independent of which test module happens to import triton first.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread than on several of a shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
