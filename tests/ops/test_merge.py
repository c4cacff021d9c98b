"""Partial attention with log-sum-exp: argument checks (the merge itself is tested against
full attention in tests/parallel/test_sharded.py)."""

import pytest
import torch

from orthros.ops import partial_attention


@pytest.mark.parametrize("key_chunk", [0, -1, 2.5])
def test_key_chunk_must_be_a_positive_int(key_chunk):
    # a negative chunk used to skip every key silently: o = 0 and lse = -inf
    q, k, v = torch.randn(1, 2, 2, 4), torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match="key_chunk"):
        partial_attention(q, k, v, key_chunk=key_chunk)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.5"])
def test_scale_must_be_finite(scale):
    # a NaN / inf scale made every output and log-sum-exp NaN without a word
    q, k, v = torch.randn(1, 2, 2, 4), torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match="scale"):
        partial_attention(q, k, v, scale=scale)
