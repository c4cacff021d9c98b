"""The output-stream op per vLLM attention backend, checked against a brute-force readout of
the paged cache.

``FLASH_ATTN`` / ``TRITON_ATTN`` (GPU backends) run vLLM's own Triton ``unified_attention``
kernel; here it runs through the Triton interpreter on CPU tensors, in a subprocess (the
interpreter must be on before Triton is imported, and vLLM's CPU build turns Triton off unless
it sees a CPU backend, so the subprocess shows it one for the import). The ``CPU_ATTN`` op is
covered end to end, against ``generate()``, by ``test_vllm_offline.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

if not os.environ.get("ORTHROS_REQUIRE_VLLM"):  # the vLLM step of CI sets it: there, no vLLM is a failure
    pytest.importorskip("vllm")

import torch  # noqa: E402

from orthros.serving import vllm_model  # noqa: E402

_CHECK = textwrap.dedent(r"""
    import json, os, sys, types
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from triton.backends import backends

    class _Driver:  # lets vLLM's CPU build import real Triton (used here through the interpreter)
        @staticmethod
        def is_active():
            return True

    backends["cpu"] = types.SimpleNamespace(driver=_Driver)
    import vllm.triton_utils  # noqa: F401
    del backends["cpu"]
    from orthros.serving.vllm_model import output_stream_attention, rows_from_metadata

    backend, dtype_name = sys.argv[1], sys.argv[2]
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(0)
    H, Hk, D, bs, num_blocks = 4, 2, 32, 16, 24
    lens = [1, 16, 17, 40, 0]          # one key, one full block, one past it, three blocks; a padding request
    R = len(lens)
    # [blocks, kv_heads, block_size, 2 * D]: keys then values in the last dim (FLASH_ATTN / TRITON_ATTN)
    kv_cache = torch.randn(num_blocks, Hk, bs, 2 * D, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g)  # blocks scattered over the cache
    block_table = perm[:R * 3].view(R, 3).to(torch.int32)
    qsl = torch.tensor([0, 1, 3, 4, 9, 9], dtype=torch.int32)  # the last request has no token this step
    metadata = types.SimpleNamespace(query_start_loc=qsl, seq_lens=torch.tensor(lens, dtype=torch.int32),
                                     max_seq_len=max(lens), block_table=block_table)
    attn = types.SimpleNamespace(attn_backend=types.SimpleNamespace(get_name=lambda: backend), layer_name="l0",
                                 num_heads=H, num_kv_heads=Hk, head_size=D, kv_cache=kv_cache, kv_cache_dtype="auto",
                                 impl=types.SimpleNamespace(scale=D ** -0.5))
    q = torch.randn(R, H * D, generator=g).to(dtype)
    s = rows_from_metadata(metadata, num_tokens=9, device="cpu")
    out = output_stream_attention(attn, q, s).view(R, H, D).double()

    errors = []
    keys, values = kv_cache.double().transpose(1, 2).split(D, dim=-1)  # [blocks, bs, Hk, D]
    for r, L in enumerate(lens[:-1]):
        t = torch.arange(L)
        blocks = block_table[r].long()[t // bs]
        K = keys[blocks, t % bs].repeat_interleave(H // Hk, dim=1)    # [L, H, D]
        V = values[blocks, t % bs].repeat_interleave(H // Hk, dim=1)
        p = (torch.einsum("hd,lhd->hl", q[r].view(H, D).double(), K) * D ** -0.5).softmax(-1)
        errors.append((torch.einsum("hl,lhd->hd", p, V) - out[r]).abs().max().item())
    print(json.dumps({"errors": errors, "rows": s.rows.tolist(), "write_rows": s.write_rows.tolist()}))
""")


@pytest.mark.parametrize("backend", ["TRITON_ATTN", "FLASH_ATTN"])
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("float16", 3e-3)])
def test_gpu_backends_output_stream_reads_the_paged_cache(backend, dtype, tol):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _CHECK, backend, dtype], capture_output=True, text=True, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(out["errors"]) == 4
    assert max(out["errors"]) < tol, out
    # the padding request's output goes to the spare row (9), never over a real request's row
    assert out["rows"] == [0, 2, 3, 8, 8]
    assert out["write_rows"] == [0, 2, 3, 8, 9]


def _attn(backend, kv_cache_dtype="auto"):
    return SimpleNamespace(attn_backend=SimpleNamespace(get_name=lambda: backend), kv_cache_dtype=kv_cache_dtype)


def test_output_stream_op_per_backend_and_refusals():
    assert vllm_model.output_stream_op(_attn("CPU_ATTN")) is vllm_model.OUTPUT_STREAM_OPS["CPU_ATTN"]
    assert vllm_model.output_stream_op(_attn("FLASH_ATTN")) is vllm_model.output_stream_op(_attn("TRITON_ATTN"))
    with pytest.raises(ValueError, match=r"FLASHINFER.*--attention-backend"):
        vllm_model.output_stream_op(_attn("FLASHINFER"))
    with pytest.raises(ValueError, match=r"kv-cache-dtype auto.*'fp8'"):
        vllm_model.output_stream_op(_attn("TRITON_ATTN", "fp8"))


def test_rows_from_metadata_without_metadata_is_the_last_row():
    s = vllm_model.rows_from_metadata(None, num_tokens=7, device="cpu")
    assert s.rows.tolist() == [6] and s.write_rows.tolist() == [6] and s.metadata is None
    m = SimpleNamespace(query_start_loc=torch.tensor([0, 5, 6, 6], dtype=torch.int32))
    s = vllm_model.rows_from_metadata(m, num_tokens=6, device="cpu")
    assert s.rows.tolist() == [4, 5, 5] and s.write_rows.tolist() == [4, 5, 6]
