"""Partial attention with log-sum-exp: argument checks (the merge itself is tested against
full attention in tests/parallel/test_sharded.py)."""

import pytest
import torch

from orthros.ops import merge_partials, partial_attention


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


def test_mismatched_shapes_refused_naming_the_arguments():
    # keys of batch 1 under queries of batch 2 were broadcast silently (and the reverse failed in a
    # reshape), a 3-D q failed unpacking its shape; merge_partials broadcast an lse of the wrong
    # shape or failed in amax on zero partials
    q, k, v = torch.randn(2, 3, 4, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    with pytest.raises(ValueError, match="k and v must be"):
        partial_attention(q, k, v)
    with pytest.raises(ValueError, match="k and v must be"):
        partial_attention(q[:1], k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1))
    with pytest.raises(ValueError, match="q must have 4 dims"):
        partial_attention(q[0], k, v)
    with pytest.raises(ValueError, match="q must be a floating"):
        partial_attention(q.long(), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1))
    for o, lse in ((torch.randn(3, 1, 4), torch.randn(3, 5)), (torch.randn(3, 2, 4), torch.randn(3, 5)),
                   (torch.randn(0, 2, 4), torch.randn(0, 2))):
        with pytest.raises(ValueError, match="merge_partials needs o"):
            merge_partials(o, lse)


def test_empty_partials_contribute_nothing_even_when_their_o_is_not_finite():
    # an empty partial (lse = -inf) has no output: a kernel may leave anything in its o (NaN, inf, garbage);
    # its weight exp(-inf) = 0 times NaN made the merged row NaN (and an all-empty row too, "never NaN")
    o = torch.randn(3, 2, 4)
    lse = torch.tensor([[0.5, float("-inf")], [float("-inf"), float("-inf")], [1.5, float("-inf")]])
    want_o, want_lse = merge_partials(o, lse)
    o[1] = float("nan")
    o[:, 1] = float("inf")
    got_o, got_lse = merge_partials(o, lse)
    assert torch.equal(got_lse, want_lse) and torch.equal(got_o, want_o)
    assert torch.equal(got_o[1], torch.zeros(4)) and torch.isfinite(got_o).all()


def test_head_dim_zero_and_non_tensor_partials_refused_naming_the_argument():
    # partial_attention with D = 0 failed computing its default scale (ZeroDivisionError);
    # merge_partials read .dim() of a list (AttributeError) and took an integer lse into
    # torch.where (RuntimeError: value cannot be converted to type int64_t without overflow)
    q, k, v = torch.randn(1, 2, 2, 0), torch.randn(1, 5, 2, 0), torch.randn(1, 5, 2, 0)
    with pytest.raises(ValueError, match="head dim"):
        partial_attention(q, k, v)
    o, lse = torch.randn(2, 3, 4), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="o must be a floating"):
        merge_partials(list(o), lse)
    with pytest.raises(ValueError, match="lse must be a floating"):
        merge_partials(o, lse.long())
    with pytest.raises(ValueError, match="o must be a floating"):
        merge_partials(o.long(), lse)


def test_tensors_on_another_device_refused_naming_them():
    # torch's own "Tensor on device meta is not on the expected device cpu!" came from inside the
    # einsum / amax (the meta device stands for a second one)
    q, k, v = torch.randn(1, 2, 2, 4), torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match="q, k, v must be on one device, got cpu, meta, cpu"):
        partial_attention(q, k.to("meta"), v)
    o, lse = partial_attention(q, k, v)
    with pytest.raises(ValueError, match="merge_partials: o and lse must be on one device, got cpu and meta"):
        merge_partials(o[None], lse[None].to("meta"))
