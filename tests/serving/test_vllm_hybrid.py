"""vLLM serving checkpoints with Gated DeltaNet layers (Orthros-H and the Linear Hybrid) through
``OrthrosHybridForCausalLM``: vLLM's own GDN layers for the base rows, the output stream reading
each request's recurrent state (``gdn_output_stream``). vLLM's CPU GDN kernels run in bf16 only
(and head dims of 128), so the reference is the package's model in fp32 on the same weights, and
the check is on logprobs: every generated token's logprob (vLLM's, bf16) against the model's
(prompt + generated tokens in one forward, an output token at every position) within a bf16
tolerance, and every greedy token within that tolerance of the model's best."""

from __future__ import annotations

import gc
import json
import os

import pytest
import torch

if not os.environ.get("ORTHROS_REQUIRE_VLLM"):
    pytest.importorskip("vllm")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import LLM, SamplingParams  # noqa: E402

from vllm_support import BLOCK_SIZE, MAX_MODEL_LEN, WINDOW, build_checkpoint  # noqa: E402

from orthros.serving import hybrid_block_tokens  # noqa: E402

TOL = 0.2  # nats: bf16 weights, activations and states against fp32. Measured on this CPU: vLLM up to 0.11 off,
#           the package's own model in bf16 up to 0.07 off; 0.2 leaves room for other CPUs' bf16 kernels, and a
#           wrong state read, head order or output gate is off by more than 1


# Qwen3.5's attention: output gate, q/k norms, RoPE on part of each head
QWEN3_5_ATTENTION = dict(attn_output_gate=True, qk_norm=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})


def hybrid_checkpoint(path, kind: str, seed: int, **extra):
    """A 4-layer ``kind`` checkpoint (3 GDN layers, then attention), ``extra`` config entries over
    the defaults, with its decays, gates and norms randomised; saved in bf16."""
    from orthros.kinds import hybrid_layout

    shape = dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
                 linear_value_head_dim=128)
    build_checkpoint(path, seed=seed, **{**shape, **hybrid_layout(kind, 4), **extra})
    import orthros

    model = orthros.OrthrosForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # decays and gates away from their init, so the states matter
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")) or ".norm.weight" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    model.to(torch.bfloat16).save_pretrained(path)
    return path


def converted_qwen3_5(tmp, seed: int):
    """A tiny random Qwen3.5 (transformers' ``Qwen3_5ForCausalLM``: gated attention, q/k norms,
    partial RoPE, zero-centred norms) converted by ``orthros convert``, its alpha/beta then
    randomised (a converted model starts at 1/0 and is trained), saved in bf16."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    import orthros
    from orthros.conversion.convert import convert_checkpoint
    from orthros.data import load_tokenizer

    tok = load_tokenizer()
    torch.manual_seed(seed)
    src = Qwen3_5ForCausalLM(Qwen3_5TextConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=128, linear_value_head_dim=128, max_position_embeddings=1024,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)).float()
    with torch.no_grad():
        for name, p in src.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.3)  # zero-centred norms away from their init
    src.save_pretrained(tmp / "qwen3_5")
    tok.save_pretrained(tmp / "qwen3_5")
    dst = tmp / "converted"
    convert_checkpoint(tmp / "qwen3_5", dst, window_size=WINDOW, dtype="fp32", progress=False)
    model = orthros.OrthrosForCausalLM.from_pretrained(dst, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("alpha", "alpha_out")):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(("beta", "beta_out")):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    model.to(torch.bfloat16).save_pretrained(dst)
    return dst


@pytest.fixture(scope="module", params=["orthros-h", "linear-hybrid", "orthros-h-qwen3.5-attention",
                                        "converted-qwen3.5"])
def served(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "converted-qwen3.5":
        path = converted_qwen3_5(tmp, seed=6)
    else:
        kind = request.param.removesuffix("-qwen3.5-attention")
        extra = QWEN3_5_ATTENTION if request.param != kind else {}
        path = hybrid_checkpoint(tmp / "ckpt", kind, seed=3, **extra)
    assert json.loads((path / "config.json").read_text())["architectures"] == ["OrthrosHybridForCausalLM"]
    import orthros

    ref = orthros.OrthrosForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(model=str(path), dtype="bfloat16", max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
              kv_cache_memory_bytes=64 << 20, max_num_seqs=8, enforce_eager=True, seed=0,
              enable_prefix_caching=False, enable_chunked_prefill=True, max_num_batched_tokens=64)
    yield request.param, llm, ref
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def check_logprobs(ref, prompt, out):
    new = list(out.outputs[0].token_ids)
    got = [lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, new)]
    ids = torch.tensor([prompt + new])
    with torch.no_grad():
        logp = torch.log_softmax(ref(ids).logits[0].float(), -1)
    rows = logp[len(prompt) - 1:len(prompt) - 1 + len(new)]
    want = rows[torch.arange(len(new)), torch.tensor(new)]
    assert torch.allclose(torch.tensor(got), want, atol=TOL), (got, want.tolist())
    assert bool((rows.max(-1).values - want <= TOL).all()), "a greedy token is not the model's best"


@pytest.mark.parametrize("lengths", [[5], [WINDOW + 1, 40, 150]])  # one request; a batch across windows and chunks
def test_greedy_logprobs_match_the_model(served, prompt_of, lengths):
    kind, llm, ref = served
    prompts = [prompt_of(n, seed=n) for n in lengths]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1))
    for p, out in zip(prompts, outs):
        check_logprobs(ref, p, out)


# GDN states small against the attention's K/V pages (GDN head dims 64, attention heads of 64 with two
# KV heads): vLLM gives a hybrid one block size for both kinds of page, 64-96 tokens here (~1-2K with
# the shape above), and caches GDN states at block boundaries only, so prompts of a few blocks can hit
PREFIX_CACHE_SHAPE = dict(linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=64,
                          linear_value_head_dim=64, num_key_value_heads=2, head_dim=64)


def test_prefix_cache_hits_keep_the_logprobs(tmp_path, prompt_of):
    """With prefix caching, a request that shares a cached prefix starts from the GDN states and
    K/V that vLLM cached at a block boundary: its output rows then read states the request did
    not compute itself, and every logprob must still match the model's."""
    path = hybrid_checkpoint(tmp_path / "h", "orthros-h", seed=7, **PREFIX_CACHE_SHAPE)
    import orthros

    ref = orthros.OrthrosForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(model=str(path), dtype="bfloat16", max_model_len=1024, block_size=BLOCK_SIZE,
              kv_cache_memory_bytes=64 << 20, max_num_seqs=8, enforce_eager=True, seed=0,
              enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=64)
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        block = cache.block_size
        # 96 tokens where vLLM keeps the states in float32 (a CPU with AVX-512 BF16), 64 in bf16 (without)
        assert cache.mamba_cache_mode == "align" and block == hybrid_block_tokens(ref.config) in (64, 96), block
        shared = prompt_of(3 * block + 5, seed=11)
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
        first = llm.generate([{"prompt_token_ids": shared}], params)[0]
        assert first.num_cached_tokens == 0
        check_logprobs(ref, shared, first)
        # vLLM keeps a GDN state at the last block boundary a prompt's prefill crossed (here 3 blocks)
        prompts = [shared, shared + prompt_of(20, seed=12), shared[:3 * block] + prompt_of(40, seed=13)]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        for p, out in zip(prompts, outs):
            assert out.num_cached_tokens >= block, (len(p), out.num_cached_tokens)  # a hit
            check_logprobs(ref, p, out)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


@pytest.mark.parametrize("block_size", [None, 64])
def test_hybrid_block_tokens_follow_the_engines_block_size(tmp_path, block_size):
    """vLLM raises the block size in steps of the --block-size it starts from (128 on CPU when none
    is given), not of 32: this checkpoint's 96-token blocks at --block-size 32 are 128 tokens with
    vLLM's default and with --block-size 64, which hybrid_block_tokens (orthros info) said were 96."""
    from orthros.serving import CPU_DEFAULT_BLOCK_SIZE

    path = build_checkpoint(tmp_path / "h", seed=8, num_hidden_layers=2, **PREFIX_CACHE_SHAPE,
                            layer_types=["linear_attention", "orthros_attention"])
    kw = {} if block_size is None else {"block_size": block_size}
    llm = LLM(model=str(path), dtype="bfloat16", max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=64 << 20,
              max_num_seqs=2, enforce_eager=True, enable_prefix_caching=True, **kw)
    try:
        import orthros

        config = orthros.OrthrosConfig.from_pretrained(path)
        want = hybrid_block_tokens(config, block_size=block_size or CPU_DEFAULT_BLOCK_SIZE)
        assert llm.llm_engine.vllm_config.cache_config.block_size == want
        assert hybrid_block_tokens(config, block_size=BLOCK_SIZE) == hybrid_block_tokens(config)  # (default: 32)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def test_attention_layers_in_several_kv_cache_groups_read_their_own_blocks(tmp_path, prompt_of):
    """vLLM gives a hybrid's layers KV-cache groups of equal size, so attention layers that
    outnumber the GDN layers (3 against 1 here) sit in several groups, each with its own block
    table. The output stream read every layer's cache through the first attention layer's block
    table: logprobs 2-5 nats off. Each layer reads through its own metadata now."""
    path = hybrid_checkpoint(tmp_path / "h", "orthros-h", seed=9, **PREFIX_CACHE_SHAPE,
                             layer_types=["orthros_attention"] * 3 + ["linear_attention"])
    import orthros

    ref = orthros.OrthrosForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(model=str(path), dtype="bfloat16", max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
              kv_cache_memory_bytes=64 << 20, max_num_seqs=4, enforce_eager=True, seed=0,
              enable_prefix_caching=False)
    try:
        runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        groups = [g.layer_names for g in runner.kv_cache_config.kv_cache_groups if "self_attn" in g.layer_names[0]]
        assert len(groups) > 1, groups  # (what this test is about)
        prompts = [prompt_of(n, seed=n) for n in (5, WINDOW + 1, 40)]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1))
        for p, out in zip(prompts, outs):
            check_logprobs(ref, p, out)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()

def test_attention_only_class_refuses_a_hybrid_checkpoint(tmp_path):
    from orthros.serving import check_servable
    import orthros

    path = hybrid_checkpoint(tmp_path / "h", "orthros-h", seed=4)
    config = orthros.OrthrosConfig.from_pretrained(path)
    with pytest.raises(ValueError, match="OrthrosHybridForCausalLM"):
        check_servable(config, hybrid=False)
    check_servable(config, hybrid=True)
    with pytest.raises(ValueError, match="serve it as OrthrosForCausalLM"):
        check_servable(orthros.OrthrosConfig(vocab_size=64, hidden_size=64, num_attention_heads=2, head_dim=32),
                       hybrid=True)


def test_an_attention_only_checkpoint_in_the_hybrid_class_is_told_its_class_whatever_the_dtype(tmp_path):
    """Served as OrthrosHybridForCausalLM (--hf-overrides) in float32, an attention-only checkpoint was
    told to pass --dtype bfloat16, then, in bf16, that its class is OrthrosForCausalLM (which serves
    it in float32 too): the checkpoint is checked before the dtype."""
    path = build_checkpoint(tmp_path / "attn", seed=9, num_hidden_layers=1)
    with pytest.raises(Exception, match="serve it as OrthrosForCausalLM"):
        llm = LLM(model=str(path), dtype="float32", max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
                  kv_cache_memory_bytes=64 << 20, max_num_seqs=2, enforce_eager=True, enable_prefix_caching=False,
                  hf_overrides={"architectures": ["OrthrosHybridForCausalLM"]})
        llm.llm_engine.engine_core.shutdown()


def test_head_dims_the_cpu_kernels_do_not_take_are_refused_at_load(tmp_path):
    from orthros.kinds import hybrid_layout

    path = build_checkpoint(tmp_path / "h32", seed=5, num_hidden_layers=4, linear_num_key_heads=1,
                            linear_num_value_heads=1, linear_key_head_dim=32, linear_value_head_dim=32,
                            **hybrid_layout("orthros-h", 4))
    with pytest.raises(Exception, match=r"head dims \[64, 128\].*; this checkpoint has linear_key_head_dim=32"):
        LLM(model=str(path), dtype="bfloat16", max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
            kv_cache_memory_bytes=64 << 20, max_num_seqs=2, enforce_eager=True, enable_prefix_caching=False)


def test_a_dtype_other_than_bf16_is_refused_at_load(tmp_path):
    """vLLM's CPU GDN kernels run in bf16 only: with --dtype float32 (or float16) the engine loaded
    and died at the first request ("AssertionError: CPU GDN attention requires BF16.", taking
    ``vllm serve`` down); the hybrid class refuses such a dtype at load, naming --dtype bfloat16."""
    path = build_checkpoint(tmp_path / "h", seed=8, num_hidden_layers=2, **PREFIX_CACHE_SHAPE,
                            layer_types=["linear_attention", "orthros_attention"])
    with pytest.raises(Exception, match="bfloat16 only.*float32.*--dtype bfloat16"):
        llm = LLM(model=str(path), dtype="float32", max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
                  kv_cache_memory_bytes=64 << 20, max_num_seqs=2, enforce_eager=True, enable_prefix_caching=False)
        llm.llm_engine.engine_core.shutdown()
