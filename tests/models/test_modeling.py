"""Model-level equivalences: the backbone of Orthros' correctness."""

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import orthros
from orthros import OrthrosForCausalLM

from conftest import tiny_config, tiny_model

V = 97


def llama_twin(model):
    """An HF LlamaForCausalLM with the same weights as a scale-offset-free Orthros model."""
    c = model.config
    lc = LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                     num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                     num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                     max_position_embeddings=c.max_position_embeddings, rope_parameters=dict(c.rope_parameters),
                     tie_word_embeddings=False)
    llama = LlamaForCausalLM(lc).eval()
    missing, unexpected = llama.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(k.split(".")[-1] in ("alpha", "beta", "alpha_out", "beta_out") for k in unexpected)
    return llama


def test_within_window_equals_standard_transformer():
    model = tiny_model(window_size=16)
    model.model.layers.apply(lambda m: m.reset_scale_offset() if hasattr(m, "reset_scale_offset") else None)
    llama = llama_twin(model)
    ids = torch.randint(0, V, (2, 16))
    with torch.no_grad():
        a = model(ids).logits
        b = llama(ids).logits
    assert (a - b).abs().max() < 1e-5
    # beyond the window the base stream no longer sees everything: logits must differ
    ids = torch.randint(0, V, (2, 40))
    with torch.no_grad():
        assert (model(ids).logits[:, 20:] - llama(ids).logits[:, 20:]).abs().max() > 1e-3


def test_full_mode_equals_llama_at_any_length():
    model = tiny_model(attention_mode="full", scale_offset=False)
    llama = llama_twin(model)
    ids = torch.randint(0, V, (2, 50))
    with torch.no_grad():
        assert (model(ids).logits - llama(ids).logits).abs().max() < 1e-5


def test_pt_logits_equal_prefill_of_every_prefix():
    model = tiny_model()
    ids = torch.randint(0, V, (2, 45))  # well above window 8
    with torch.no_grad():
        pt = model(ids).logits
        assert pt.shape == (2, 45, V)
        for t in [0, 3, 7, 8, 9, 20, 44]:
            pre = model(ids[:, : t + 1], logits_to_keep=1, use_cache=False).logits[:, 0]
            torch.testing.assert_close(pt[:, t], pre, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["orthros", "full", "window"])
def test_cached_generation_equals_uncached_with_left_padding(mode):
    model = tiny_model(seed=1, attention_mode=mode)
    lens = [5, 13, 9]
    prompts = [torch.randint(1, V, (n,)) for n in lens]
    T = max(lens)
    ids = torch.zeros(len(lens), T, dtype=torch.long)
    mask = torch.zeros(len(lens), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):] = p
        mask[i, T - len(p):] = 1
    new = 12
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
        for i, p in enumerate(prompts):  # each prompt alone, no cache, one token at a time
            x = p.view(1, -1)
            for _ in range(new):
                nxt = model(x, use_cache=False, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
                x = torch.cat([x, nxt], dim=1)
            assert torch.equal(out[i, T:], x[0, len(p):]), f"row {i}"


def test_generate_sampling_and_eos_run():
    model = tiny_model()
    ids = torch.randint(0, V, (2, 6))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=5, do_sample=True, top_k=10, top_p=0.9, temperature=0.8)
        assert out.shape == (2, 11)
        eos = int(out[0, 6])
        out2 = model.generate(ids[:1], max_new_tokens=5, do_sample=False, eos_token_id=eos, pad_token_id=0)
        greedy_first = model(ids[:1], logits_to_keep=1).logits[0, -1].argmax()
        assert out2.shape[1] <= 11 and (out2[0, 6] == greedy_first)


def test_generate_cache_implementation():
    """``cache_implementation`` "dynamic" (an argument or the generation config's) generates with
    the OrthrosCache; the others are refused by name (they failed with ``KeyError:
    'orthros_attention'``, or "passing both a cache and cache_implementation" for a generation
    config's "dynamic")."""
    model = tiny_model()
    ids = torch.randint(0, V, (2, 6))
    kw = dict(max_new_tokens=4, do_sample=False, use_engine=False)
    with torch.no_grad():
        ref = model.generate(ids, **kw)
        assert torch.equal(model.generate(ids, cache_implementation="dynamic", **kw), ref)
        model.generation_config.cache_implementation = "dynamic"
        assert torch.equal(model.generate(ids, **kw), ref)
        for impl in ("static", "offloaded"):
            with pytest.raises(ValueError, match=f"cache_implementation='{impl}' is not supported"):
                model.generate(ids, cache_implementation=impl, **kw)


@torch.no_grad()
def test_a_cropped_cache_continues_from_its_new_length():
    """``OrthrosCache.crop`` (assisted / prompt-lookup decoding rolls back rejected drafts) left
    the token count the forward records at the old length: the next chunk took positions past the
    kept K/V, and prompt-lookup generation differed from greedy."""
    model = tiny_model()
    ids = torch.randint(1, V, (1, 20))
    full = model(ids).logits
    cache = orthros.models.OrthrosCache()
    model(ids[:, :15], past_key_values=cache)
    cache.crop(-5)
    assert cache.get_seq_length() == 10
    torch.testing.assert_close(model(ids[:, 10:], past_key_values=cache).logits, full[:, 10:], rtol=1e-5, atol=1e-5)
    ids = torch.cat([ids, ids[:, :10]], dim=1)  # a repeat: prompt lookup drafts from it
    kw = dict(max_new_tokens=15, do_sample=False, use_engine=False)
    assert torch.equal(model.generate(ids, prompt_lookup_num_tokens=4, **kw), model.generate(ids, **kw))


@torch.no_grad()
def test_a_given_cache_is_used_whatever_use_cache():
    """A cache passed with ``use_cache=False`` was ignored: the chunk ran from position 0 with no
    past (silently wrong logits), where transformers' models continue from it. Generation without
    a cache (the argument, the generation config's or the model config's ``use_cache=False``)
    still runs every step over the whole sequence, and equals cached generation."""
    model = tiny_model()
    ids = torch.randint(1, V, (2, 12))
    cache = orthros.models.OrthrosCache()
    model(ids[:, :8], past_key_values=cache)
    out = model(ids[:, 8:], past_key_values=cache, use_cache=False)
    torch.testing.assert_close(out.logits, model(ids).logits[:, 8:], rtol=1e-5, atol=1e-5)
    assert cache.get_seq_length() == 12
    kw = dict(max_new_tokens=4, do_sample=False, use_engine=False)
    ref = model.generate(ids, **kw)
    assert torch.equal(model.generate(ids, use_cache=False, **kw), ref)
    model.generation_config.use_cache = False
    assert torch.equal(model.generate(ids, **kw), ref)
    no_cache = tiny_model(use_cache=False)
    assert torch.equal(no_cache.generate(ids, **kw), ref)


def test_per_layer_outputs_refused():
    """HF's ``output_attentions`` / ``output_hidden_states`` are not computed: refused (they were
    accepted and returned as ``None``), as an argument or from the config."""
    model = tiny_model()
    ids = torch.randint(0, V, (1, 5))
    for name in ("output_attentions", "output_hidden_states"):
        for fwd in (model, model.model):
            with pytest.raises(ValueError, match=name):
                fwd(ids, **{name: True})
        with pytest.raises(ValueError, match=name):
            model.generate(ids, max_new_tokens=2, return_dict_in_generate=True, use_engine=False, **{name: True})
    model.config.output_hidden_states = True
    with pytest.raises(ValueError, match="output_hidden_states"):
        model(ids)
    assert model(ids, output_hidden_states=False).logits.shape == (1, 5, V)


def test_sft_loss_equals_pt_loss_on_answer_positions():
    model = tiny_model()
    ids = torch.randint(0, V, (2, 30))
    labels = torch.full_like(ids, -100)
    labels[0, 10:15] = ids[0, 10:15]  # answer spans
    labels[0, 22:26] = ids[0, 22:26]
    labels[1, 5:9] = ids[1, 5:9]
    with torch.no_grad():
        sft = model(ids, labels=labels)
        pt_logits = model(ids).logits
    # PT logits at position t predict token t+1
    lp = torch.log_softmax(pt_logits[:, :-1].float(), -1)
    tgt = labels[:, 1:]
    m = tgt != -100
    pt_loss = -(lp.gather(-1, tgt.clamp(min=0)[..., None])[..., 0] * m).sum() / m.sum()
    torch.testing.assert_close(sft.loss, pt_loss, rtol=1e-5, atol=1e-6)
    # SFT computes output tokens only where some row is scored
    assert sft.logits.shape[1] == int(m.any(0).sum())


def test_loss_divides_by_num_items_in_batch():
    """HF Trainer (gradient accumulation) passes ``num_items_in_batch``, the scored tokens of all
    its micro-batches, and then does not divide the loss by the accumulation steps itself: the
    loss must be the summed cross-entropy over that count (it was the per-micro-batch mean,
    making an accumulated step's gradient ``steps`` times too large)."""
    model = tiny_model()
    ids = torch.randint(0, V, (2, 12))
    labels = ids.clone()
    labels[0, :7] = -100
    with torch.no_grad():
        mean = model(ids, labels=labels).loss
        n_scored = int((labels[:, 1:] != -100).sum())
        for n in (40, torch.tensor(40)):
            torch.testing.assert_close(model(ids, labels=labels, num_items_in_batch=n).loss, mean * n_scored / 40)


def test_a_micro_batch_of_a_step_that_scores_nothing_has_loss_zero():
    """A Trainer step whose micro-batches score no token passes ``num_items_in_batch=0``: the loss was
    0 / 0 = NaN (in the logs, and to any NaN guard); without the count it is 0."""
    model = tiny_model()
    ids = torch.randint(0, V, (2, 6))
    labels = torch.full_like(ids, -100)
    for n in (None, 0, torch.tensor(0)):
        assert model(ids, labels=labels, num_items_in_batch=n).loss.item() == 0.0


def test_packed_documents_equal_separate_runs():
    model = tiny_model()
    docs = [torch.randint(0, V, (n,)) for n in (7, 20, 3)]
    ids = torch.cat(docs).view(1, -1)
    cu = torch.tensor([0, 7, 27, 30])
    with torch.no_grad():
        packed = model(ids, cu_seqlens=cu, use_cache=False).logits
        for d, a in zip(docs, cu[:-1].tolist()):
            alone = model(d.view(1, -1), use_cache=False).logits
            torch.testing.assert_close(packed[:, a:a + len(d)], alone, rtol=1e-5, atol=1e-5)


def test_packed_loss_scores_no_position_against_the_next_document():
    # labels=ids with cu_seqlens trained each document's last token to predict the next one's first
    model = tiny_model()
    docs = [torch.randint(0, V, (n,)) for n in (7, 20, 3)]
    ids = torch.cat(docs).view(1, -1)
    with torch.no_grad():
        packed = model(ids, labels=ids, cu_seqlens=torch.tensor([0, 7, 27, 30]), use_cache=False)
        alone = [model(d.view(1, -1), labels=d.view(1, -1), use_cache=False).loss * (len(d) - 1) for d in docs]
    assert packed.logits.shape[1] == 27  # output tokens only where a target of the same document follows
    torch.testing.assert_close(packed.loss, sum(alone) / 27, rtol=1e-5, atol=1e-6)


def test_packed_documents_return_no_cache_and_refuse_one():
    """A cache holds one sequence a row: packed documents (``cu_seqlens``) return none by default
    (continuing one gave wrong logits, or a shape error with GDN layers), and asking for one
    (``use_cache=True`` or a cache given) is refused, naming both arguments."""
    from orthros.models import OrthrosCache

    model = tiny_model()
    ids = torch.randint(0, V, (1, 12))
    cu = torch.tensor([0, 5, 12])
    with torch.no_grad():
        assert model(ids, cu_seqlens=cu).past_key_values is None
        for kw in (dict(use_cache=True), dict(past_key_values=OrthrosCache())):
            with pytest.raises(ValueError, match="cu_seqlens.*cannot be combined with a KV cache"):
                model(ids, cu_seqlens=cu, **kw)


def test_cu_seqlens_of_floats_or_strings_refused_naming_it():
    """The model took float cu_seqlens by truncating them ([0., 2.7, 6.] ran as [0, 2, 6]) and a string
    raised torch's TypeError: both are refused by the op's check, naming cu_seqlens."""
    model = tiny_model()
    ids = torch.randint(0, V, (1, 6))
    with torch.no_grad():
        for bad in ([0.0, 2.7, 6.0], torch.tensor([0.0, 3.0, 6.0]), "x"):
            with pytest.raises(ValueError, match="cu_seqlens"):
                model(ids, cu_seqlens=bad, use_cache=False)
        model(ids, cu_seqlens=[0, 2, 6], use_cache=False)  # a list of ints stays accepted


def test_output_positions_of_another_batch_size_are_named():
    model = tiny_model()
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad(), pytest.raises(ValueError, match=r"output_positions must be .*1 or 2, T_out\].*\(3, 2\)"):
        model(ids, output_positions=torch.tensor([[1, 4]] * 3))


def test_training_step_backpropagates_to_everything():
    model = tiny_model().train()
    ids = torch.randint(0, V, (2, 20))
    model(ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_gradient_checkpointing_matches():
    ids = torch.randint(0, V, (2, 20))
    m1, m2 = tiny_model().train(), tiny_model().train()
    (getattr(m2, "activation_checkpointing_enable", None) or m2.gradient_checkpointing_enable)()  # renamed in transformers 5.2x
    l1, l2 = m1(ids, labels=ids).loss, m2(ids, labels=ids).loss
    l1.backward()
    l2.backward()
    torch.testing.assert_close(l1, l2)
    assert m1.model.layers[-1].self_attn.scale_offset_params().keys() == {"alpha_out", "beta_out"}
    g1 = m1.model.layers[0].self_attn.alpha.grad
    torch.testing.assert_close(g1, m2.model.layers[0].self_attn.alpha.grad, rtol=1e-5, atol=1e-7)


def test_save_load_round_trip(tmp_path):
    model = tiny_model(attention_bias=True, qk_norm=True, tie_word_embeddings=True)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert AutoConfig.from_pretrained(tmp_path).model_type == "orthros"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, OrthrosForCausalLM)
    ids = torch.randint(0, V, (1, 25))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    assert isinstance(AutoModel.from_pretrained(tmp_path), orthros.OrthrosModel)


def test_llama3_rope_scaling_runs():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    model = tiny_model(rope_parameters=rope)
    assert torch.isfinite(model(torch.randint(0, V, (1, 12))).logits).all()


@pytest.mark.parametrize("rope, missing", [({"rope_type": "yarn"}, "factor"), ({"rope_type": "linear"}, "factor"),
                                           ({"rope_type": "llama3", "factor": 8.0}, "high_freq_factor")])
def test_a_rope_type_without_its_keys_is_refused_by_the_config(rope, missing):
    """A RoPE type without its keys (a 'yarn' without 'factor') was taken by the config and failed building
    the model with transformers' KeyError; it is the config's ValueError naming rope_parameters."""
    with pytest.raises(ValueError, match=rf"^OrthrosConfig.rope_parameters: Missing required keys .*{missing}"):
        tiny_config(rope_parameters=rope)


@pytest.mark.parametrize("rope", [{"rope_type": "yarn", "factor": 4.0},
                                  {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}])
def test_a_rope_type_without_original_max_position_embeddings_takes_the_model_length(rope):
    """transformers fills llama3 / yarn's original_max_position_embeddings (max_position_embeddings) in
    PreTrainedConfig.__init__; the config's key check ran before it and refused these (a reviewer's finding)."""
    config = tiny_config(rope_parameters={"rope_theta": 10000.0, **rope})
    assert config.rope_parameters["original_max_position_embeddings"] == config.max_position_embeddings
    model = tiny_model(rope_parameters={"rope_theta": 10000.0, **rope})
    assert torch.isfinite(model(torch.randint(0, V, (1, 12))).logits).all()


def test_legacy_rope_scaling_keeps_its_rope_theta():
    # a transformers 4.x style config (rope_scaling beside rope_theta): rope_theta became 10000
    legacy = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    config = tiny_config(rope_parameters=None, rope_scaling=legacy, rope_theta=500000.0)
    want = {"rope_type": "llama3", "rope_theta": 500000.0, **{k: v for k, v in legacy.items() if k != "type"}}
    assert config.rope_parameters == want
    rope = tiny_model(rope_parameters=want).model.rotary_emb.inv_freq
    torch.testing.assert_close(OrthrosForCausalLM(config).model.rotary_emb.inv_freq, rope)


@pytest.mark.parametrize("cast", [lambda m: m.to(torch.bfloat16), lambda m: m.half(),
                                  lambda m: m.to("cpu", torch.bfloat16)])
def test_a_dtype_cast_keeps_the_rope_frequencies_in_float32(cast):
    # model.to(bf16) rounded inv_freq to bf16 (2^-9 relative): at position 20000 the cos/sin table was
    # off by ~1 (angles off by radians, growing with the distance between tokens), where a model built
    # in bf16 (its inv_freq computed in float32) is exact
    model = tiny_model(max_position_embeddings=32768)
    pos = torch.arange(20000, 20016).view(1, -1)
    want = model.model.rotary_emb(pos)
    cast(model)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    for got, w in zip(model.model.rotary_emb(pos), want):
        torch.testing.assert_close(got, w, rtol=0, atol=0)
    assert model.model.embed_tokens.weight.dtype != torch.float32  # the weights were cast


@pytest.mark.parametrize("kw,name", [
    (dict(window_size=0), "window_size"),
    (dict(num_key_value_heads=3), "num_attention_heads"),
    (dict(attention_mode="linear"), "attention_mode"),
    (dict(head_dim=7), "head_dim"),
    # an odd head_dim the user never set (hidden_size 44 over 4 heads) was named as if it were given
    (dict(hidden_size=44, head_dim=None), r"head_dim must be even for RoPE, got 11 \(hidden_size // "
                                          r"num_attention_heads = 44 // 4, the default where head_dim is not given"),
    (dict(hidden_size=-1), "hidden_size"),
    (dict(attn_backend="cuda"), "attn_backend"),
    (dict(rms_norm_eps=0), "rms_norm_eps"),
    (dict(rms_norm_eps=float("nan")), "rms_norm_eps"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": float("nan")}), "rope_theta"),
    # an unknown rope_type was refused only when a model was built (a config saved alone wrote it)
    (dict(rope_parameters={"rope_type": "bogus", "rope_theta": 1e4}), r"rope_parameters\['rope_type'\]='bogus'"),
    # partial_rotary_factor outside (0, 1] failed in the forward (1.5: a tensor-size error; -0.5:
    # torch's arange error) or ran with no rotation (0.0, or a width under 2)
    *[(dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": f}),
       r"^OrthrosConfig.rope_parameters\['partial_rotary_factor'\] must be a number in \(0, 1\]")
      for f in (1.5, -0.5, 0.0, "0.5")],
    (dict(partial_rotary_factor=1.5), r"rope_parameters\['partial_rotary_factor'\] must be a number in \(0, 1\]"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.1}),
     r"\['partial_rotary_factor'\]=0.1 gives a rotary width of int\(head_dim \* factor\) = 1 of head_dim=12: it "
     r"must be >= 2; e.g. 0.16666666666666666 \(width 2\)"),
    # a scaling factor of 0, below 0, NaN or a string passed with transformers' warning at most and ran with
    # reversed, infinite or NaN frequencies (or failed in the model's init, unnamed)
    *[(dict(rope_parameters={"rope_type": t, "rope_theta": 1e4, "factor": f}),
       rf"^OrthrosConfig.rope_parameters\['factor'\] \(the {t} RoPE scaling\) must be a finite number > 0, got")
      for t, f in (("linear", -1.0), ("linear", 0.0), ("dynamic", float("nan")), ("linear", "2"))],
    (dict(hidden_act="swiglu_typo"), "hidden_act"),
    (dict(initializer_range=-0.02), "initializer_range"),
    (dict(pad_token_id=97), "pad_token_id"),
    (dict(sliding_window=128), "sliding_window"),
    # Llama / Qwen fields the model does not implement were kept as extra fields and did nothing
    (dict(attention_dropout=0.1), r"^OrthrosConfig has no attention_dropout \(attention takes no dropout here\), "
                                  r"got attention_dropout=0.1"),
    (dict(use_sliding_window=True), r"^OrthrosConfig has no use_sliding_window .*`window_size`"),
    # a switch that is not True/False (a string from a JSON or a command line) was taken by its truth
    # value: "false" built q/k norms, scale offsets, biases, output gates
    (dict(qk_norm="false"), "qk_norm"),
    (dict(scale_offset="no"), "scale_offset"),
    (dict(attention_bias="False"), "attention_bias"),
    (dict(attn_output_gate="false"), "attn_output_gate"),
    # "false" tied the LM head to the embedding; use_cache="false" kept a cache
    (dict(tie_word_embeddings="false"), "tie_word_embeddings"),
    (dict(use_cache="false"), "use_cache"),
])
def test_invalid_config_values(kw, name):
    with pytest.raises(ValueError, match=name):
        tiny_config(**kw)


def test_an_odd_rotary_width_is_taken_as_transformers_takes_it():
    """transformers takes an odd partial rotary width (its validate_rope: rounded up, still fits); a
    config written elsewhere with one loads and runs here."""
    config = tiny_config(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25})
    assert int(config.head_dim * 0.25) % 2 == 1
    torch.manual_seed(0)
    out = OrthrosForCausalLM(config)(torch.randint(0, config.vocab_size, (1, 5))).logits
    assert out.shape[:2] == (1, 5) and torch.isfinite(out).all()


@pytest.mark.parametrize("kw,match", [
    (dict(window_size=0), "window_size"),
    (dict(num_hidden_layers=2), r"one entry per layer \(num_hidden_layers=2\), got 3"),
    (dict(attention_mode="full"), "contradicts layer_types"),
])
def test_fields_set_after_init_are_checked_before_a_model_or_file(tmp_path, kw, match):
    # from_pretrained(path, **kw) sets its keywords on the loaded config, bypassing __init__'s
    # checks: window 0 ran, full attention ran under orthros_attention layer_types, and
    # save_pretrained wrote a checkpoint whose config.json then failed to load
    # (from_pretrained(path, attention_mode=...) switches the layer kinds with it: the next test)
    tiny_model().save_pretrained(tmp_path / "ok")
    if "attention_mode" not in kw:
        with pytest.raises(ValueError, match=match):
            OrthrosForCausalLM.from_pretrained(tmp_path / "ok", **kw)
        with pytest.raises(ValueError, match=match):  # the config alone too: it came back unchecked
            AutoConfig.from_pretrained(tmp_path / "ok", **kw)
    config = tiny_config()
    for k, v in kw.items():
        setattr(config, k, v)
    with pytest.raises(ValueError, match=match):
        OrthrosForCausalLM(config)
    with pytest.raises(ValueError, match=match):
        config.save_pretrained(tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_from_pretrained_refuses_sliding_window_as_init_does(tmp_path):
    # OrthrosConfig(sliding_window=4) is refused, but from_pretrained(path, sliding_window=4) was dropped without a
    # word by AutoConfig (the window kept) and a TypeError of OrthrosForCausalLM.__init__ for the model
    tiny_model().save_pretrained(tmp_path / "m")
    for load in (AutoConfig.from_pretrained, OrthrosForCausalLM.from_pretrained):
        with pytest.raises(ValueError, match=r"OrthrosConfig has no `sliding_window` .*; use `window_size`"):
            load(tmp_path / "m", sliding_window=4)

@pytest.mark.parametrize("hybrid", [False, True])
def test_from_pretrained_with_attention_mode_or_layer_types_runs_that_baseline(tmp_path, hybrid):
    # from_pretrained(path, attention_mode="full"): the saved orthros_attention layer_types contradicted the
    # keyword (a ValueError), so a checkpoint could not be loaded as its Transformer / SWA baseline by its mode
    from orthros.kinds import layer_type_for

    types = ["linear_attention", "orthros_attention", "linear_attention"] if hybrid else None
    model = tiny_model(layer_types=types)
    model.save_pretrained(tmp_path / "m")
    ids = torch.randint(0, V, (2, 30))
    for mode, kw in [("full", dict(attention_mode="full")), ("window", dict(attention_mode="swa")),
                     ("full", dict(layer_types=[t.replace("orthros", "full") for t in model.config.layer_types]))]:
        config = AutoConfig.from_pretrained(tmp_path / "m", **kw)
        assert config.attention_mode == mode
        assert config.layer_types == [t if t == "linear_attention" else layer_type_for(mode)
                                      for t in model.config.layer_types]
        loaded = OrthrosForCausalLM.from_pretrained(tmp_path / "m", **kw).eval()
        twin = OrthrosForCausalLM(tiny_config(layer_types=config.layer_types)).eval()  # built in that mode
        assert not twin.load_state_dict(model.state_dict(), strict=False).missing_keys
        with torch.no_grad():
            assert torch.equal(loaded(ids).logits, twin(ids).logits)
            assert (loaded(ids).logits - model(ids).logits).abs().max() > 1e-4  # another model indeed


def test_from_pretrained_with_fewer_layers_and_their_layer_types(tmp_path):
    # from_pretrained(path, num_hidden_layers=2, layer_types=[...] * 2), a checkpoint's first layers: 86779e0
    # built the config with the new layer_types and the saved layer count ("one entry per layer ... got 2")
    model = tiny_model()
    model.save_pretrained(tmp_path / "m")
    n = model.config.num_hidden_layers - 1
    loaded = OrthrosForCausalLM.from_pretrained(tmp_path / "m", num_hidden_layers=n, layer_types=["full_attention"] * n)
    assert (loaded.config.num_hidden_layers, loaded.config.attention_mode) == (n, "full") and len(loaded.model.layers) == n


def test_a_config_that_would_not_load_is_refused_before_the_model_saves(tmp_path):
    # resizing below the pad id wrote a checkpoint whose config.json failed to load; a bad field
    # left an empty directory behind
    model = tiny_model(pad_token_id=5)
    model.resize_token_embeddings(4, mean_resizing=False)
    with pytest.raises(ValueError, match=r"pad_token_id must be None or an id in \[-vocab_size, vocab_size\) = \[-4, 4\)"):
        model.save_pretrained(tmp_path / "m")
    model.config.pad_token_id, model.config.window_size = None, 0
    with pytest.raises(ValueError, match="window_size"):
        model.save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_numpy_integer_config_fields_are_saved_as_python_ints(tmp_path):
    # check_positive_int takes NumPy integers (operator.index) since 9efdddd: a config built with them passed its
    # checks, then save_pretrained failed ("Object of type int64 is not JSON serializable")
    config = tiny_config(num_hidden_layers=np.int64(2), window_size=np.int32(8), head_dim=torch.tensor(12))
    assert type(config.num_hidden_layers) is int and type(config.window_size) is int and type(config.head_dim) is int
    OrthrosForCausalLM(config).save_pretrained(tmp_path / "m")
    assert OrthrosForCausalLM.from_pretrained(tmp_path / "m").config.num_hidden_layers == 2
    hybrid = tiny_config(num_hidden_layers=2, layer_types=["linear_attention", "orthros_attention"],
                         linear_num_key_heads=np.int64(2), linear_conv_kernel_dim=np.int64(4))
    assert type(hybrid.linear_num_key_heads) is int and type(hybrid.linear_conv_kernel_dim) is int
    hybrid.to_json_string()
    tiny_config(linear_key_head_dim=torch.tensor(2.0))  # unused without GDN layers: accepted as before


def test_a_mode_alias_set_after_init_runs_that_mode():
    # "transformer" set on a config after __init__ computed sliding-window attention
    ref = tiny_model(attention_mode="full")
    config = tiny_config()
    config.attention_mode, config.layer_types = "transformer", ["full_attention"] * config.num_hidden_layers
    model = OrthrosForCausalLM(config).eval()
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(0, V, (1, 20))  # > window 8
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits)


@pytest.mark.parametrize("name, value", [("attention_mode", "full"), ("attention_mode", "swa"), ("window_size", 2),
                                         ("layer_types", ["full_attention"] * 3)])
def test_layer_fields_set_on_the_config_of_a_built_model_are_refused_by_name(name, value):
    # model.config.attention_mode = "full" failed in a layer ("The size of tensor a (0) must match ..."); a
    # window_size set so was ignored without a word (the layers keep what they were built with)
    model = tiny_model()
    ids = torch.randint(0, V, (1, 12))
    ref = model(ids).logits
    setattr(model.config, name, value)
    for fn in (model, model.model):
        with pytest.raises(ValueError, match=rf"^config\.{name} was set to .* after the model was built with"):
            fn(ids)
    setattr(model.config, name, tiny_config().to_dict()[name])
    torch.testing.assert_close(model(ids).logits, ref)
    model.config.attention_mode = "orthros"  # the built mode (an alias of it too) runs
    model(ids)
    model = tiny_model(attention_mode="full")
    model.config.attention_mode = "transformer"
    model(ids)


@torch.no_grad()
def test_num_logits_to_keep_is_taken_as_logits_to_keep():
    # transformers < 4.50's name went into **kwargs unread: logits (and Orthros' output tokens) for all T
    # positions where the caller asked for the last one
    model = tiny_model()
    ids = torch.randint(0, V, (2, 10))
    torch.testing.assert_close(model(ids, num_logits_to_keep=3).logits, model(ids, logits_to_keep=3).logits)
    with pytest.raises(ValueError, match="not both"):
        model(ids, logits_to_keep=2, num_logits_to_keep=3)


@torch.no_grad()
def test_a_legacy_tuple_cache_is_refused_by_name():
    # transformers 4.x's tuple of (k, v) per layer failed in "'tuple' object has no attribute 'get_seq_length'"
    model = tiny_model()
    ids = torch.randint(0, V, (1, 6))
    kv = model(ids, use_cache=True).past_key_values
    legacy = tuple((layer.keys, layer.values) for layer in kv.layers)
    for fn in (model, model.model):
        with pytest.raises(ValueError, match=r"past_key_values \(cache\) must be a transformers Cache .*got tuple"):
            fn(ids[:, :1], past_key_values=legacy)


@torch.no_grad()
def test_a_sliding_or_static_cache_is_refused_by_name():
    """A given cache must keep every token's K/V, each once (the output stream attends to all of
    them): a StaticCache (its zero-filled slots past the tokens were attended) or a DynamicCache
    with sliding-window layers (old tokens dropped) gave silently wrong logits and generations."""
    from transformers import DynamicCache, LlamaConfig, StaticCache

    from orthros.models.modeling_orthros import CACHE_KWARG

    model = tiny_model()
    c = model.config
    lc = LlamaConfig(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads, head_dim=c.head_dim,
                     num_key_value_heads=c.num_key_value_heads, num_hidden_layers=c.num_hidden_layers, sliding_window=4)
    ids = torch.randint(0, V, (2, 12))
    sliding = LlamaConfig(**{**lc.to_dict(), "layer_types": ["sliding_attention"] * c.num_hidden_layers})
    for cache in (StaticCache(config=lc, max_cache_len=32), DynamicCache(config=sliding)):
        with pytest.raises(ValueError, match=r"past_key_values \(cache\) must keep every token's K/V.*" + type(cache).__name__):
            model(ids, past_key_values=cache)
        with pytest.raises(ValueError, match="must keep every token's K/V"):
            model.generate(ids, max_new_tokens=2, use_engine=False, **{CACHE_KWARG: cache})
    # a DynamicCache built without a config keeps everything: taken, and equal to the default
    kw = dict(max_new_tokens=4, do_sample=False, use_engine=False)
    assert torch.equal(model.generate(ids, **{CACHE_KWARG: DynamicCache()}, **kw), model.generate(ids, **kw))


@torch.no_grad()
@pytest.mark.parametrize("mode", ["orthros", "window", "full"])
def test_transformers_caches_built_from_the_models_config(mode):
    """transformers' own docs build a cache from the model's config (DynamicCache(config=model.config)): that
    failed inside transformers with a bare KeyError: 'orthros_attention' (the layer type was in none of its
    mappings). A DynamicCache so built is taken and generates what the default cache does; a StaticCache so
    built is refused by the model, by name (its empty slots would be attended)."""
    from transformers import DynamicCache, StaticCache

    from orthros.models.modeling_orthros import CACHE_KWARG

    model = tiny_model(attention_mode=mode)
    ids = torch.randint(0, V, (2, 12))
    kw = dict(max_new_tokens=4, do_sample=False, use_engine=False)
    got = model.generate(ids, **{CACHE_KWARG: DynamicCache(config=model.config)}, **kw)
    assert torch.equal(got, model.generate(ids, **kw))
    with pytest.raises(ValueError, match=r"must keep every token's K/V.*StaticCache"):
        model.generate(ids, **{CACHE_KWARG: StaticCache(config=model.config, max_cache_len=32)}, **kw)


@torch.no_grad()
@pytest.mark.parametrize("kind", ["orthros", "orthros-h"])
def test_a_cache_of_another_batch_size_is_refused_by_name(kind):
    """Continuing a cache with fewer (or more) rows than it was filled with failed inside the first
    layer's cache update: "RuntimeError: Sizes of tensors must match except in dimension 2"."""
    from orthros.kinds import hybrid_layout

    model = tiny_model(**({} if kind == "orthros" else dict(hybrid_layout(kind, 4), num_hidden_layers=4)))
    ids = torch.randint(0, V, (2, 6))
    cache = model(ids, use_cache=True).past_key_values
    with pytest.raises(ValueError, match=r"past_key_values \(cache\) holds 2 sequences, the input 1 rows"):
        model(ids[:1, :1], past_key_values=cache)
    assert cache.get_seq_length() == 6  # untouched: it continues with its own batch
    torch.testing.assert_close(model(ids[:, :1], past_key_values=cache).logits,
                               model(torch.cat([ids, ids[:, :1]], 1)).logits[:, 6:], rtol=1e-5, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("other, match", [
    (dict(num_key_value_heads=4), r"layer 0: it holds K/V \[2, 2, 6, 12\], .* needs K/V \[2, 4, 6, 12\]"),
    (dict(head_dim=16), r"layer 0: it holds K/V \[2, 2, 6, 12\], .* needs K/V \[2, 2, 6, 16\]"),
    (dict(num_hidden_layers=4), r"layer 3: it holds nothing, .* needs K/V"),
    (dict(num_hidden_layers=2), r"layer 2: it holds K/V \[2, 2, 6, 12\], .* needs nothing"),
    ("orthros-h", r"layer 0: it holds K/V .* needs a GDN state"),
])
def test_a_cache_of_another_config_is_refused_by_name(other, match):
    """A cache filled by a model of other K/V heads or head_dim failed inside the first layer's cache update
    ("RuntimeError: Sizes of tensors must match"); one of other layers or layer kinds ran silently with wrong
    logits. The forward names the first layer that differs before any layer runs."""
    from orthros.kinds import hybrid_layout

    ids = torch.randint(0, V, (2, 6))
    cache = tiny_model()(ids, use_cache=True).past_key_values
    if other == "orthros-h":
        other = dict(hybrid_layout(other, 4), num_hidden_layers=4)
    with pytest.raises(ValueError, match=r"past_key_values \(cache\) does not fit this model at " + match):
        tiny_model(**other)(ids[:, :1], past_key_values=cache)
    assert cache.get_seq_length() == 6


@torch.no_grad()
def test_a_hybrid_cache_in_an_attention_model_is_refused_by_name():
    from orthros.kinds import hybrid_layout

    ids = torch.randint(0, V, (2, 6))
    cache = tiny_model(**hybrid_layout("orthros-h", 4), num_hidden_layers=4)(ids, use_cache=True).past_key_values
    with pytest.raises(ValueError, match=r"at layer 0: it holds a GDN state \(conv \[2, 144, 3\], recurrent "
                                         r"\[2, 4, 12, 12\]\), .* needs K/V \[2, 2, 6, 12\]"):
        tiny_model(num_hidden_layers=4)(ids[:, :1], past_key_values=cache)


@torch.no_grad()
@pytest.mark.parametrize("ids", [torch.tensor([1, 2, 3]), torch.zeros(2, 0, dtype=torch.long)])
def test_generate_refuses_unbatched_or_empty_input_ids_by_name(ids):
    # a 1-D prompt (tokenizer.encode's list as a tensor) failed in transformers' generate with "IndexError:
    # tuple index out of range", an empty one with "index -1 is out of bounds"; the forward names them
    model = tiny_model()
    for call in (lambda: model.generate(ids, max_new_tokens=2), lambda: model.generate(input_ids=ids, max_new_tokens=2)):
        with pytest.raises(ValueError, match=r"input_ids must be \[B, T\] with T >= 1"):
            call()


@torch.no_grad()
@pytest.mark.parametrize("ids", [np.array([[1, 2]]), [[1, 2]]], ids=["numpy", "list"])
def test_generate_refuses_input_ids_that_are_no_tensor_by_name(ids):
    # transformers failed with "AttributeError: 'str' object has no attribute 'type'" (NumPy) or
    # "'list' object has no attribute 'shape'"
    with pytest.raises(TypeError, match=r"input_ids must be a torch.Tensor .* got (ndarray|list)"):
        tiny_model().generate(ids, max_new_tokens=2)


def test_invalid_forward_inputs():
    model = tiny_model()
    ids = torch.randint(0, V, (2, 10))
    with pytest.raises(ValueError, match="output_positions"):
        model(ids, output_positions=torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="output_positions"):
        model(ids, output_positions=torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="attention_mask"):  # inner padding
        model(ids, attention_mask=torch.tensor([[1] * 3 + [0] * 4 + [1] * 3] * 2))
    with pytest.raises(ValueError, match="attention_mask"):  # right padding after a given cache
        model(ids, attention_mask=torch.tensor([[1] * 5 + [0] * 5] * 2), past_key_values=orthros.OrthrosCache())
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids, logits_to_keep=-1)
    for bad in (torch.tensor([-1]), torch.tensor([4, 2]), torch.tensor([0.5])):  # errors named output_positions
        with pytest.raises(ValueError, match="^logits_to_keep"):
            model(ids, logits_to_keep=bad)
    with pytest.raises(ValueError, match="labels"):
        model(ids, labels=ids[:, :5])
    # these failed inside torch (AttributeError on None, gather / expand size errors)
    with pytest.raises(ValueError, match="input_ids or inputs_embeds"):
        model()
    emb = model.model.embed_tokens(ids)
    for fn in (model, model.model):  # both inputs: which one was meant?
        with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
            fn(ids, inputs_embeds=emb)
    with pytest.raises(ValueError, match="labels"):
        model(ids, labels=ids[:1])
    for pos in (torch.arange(5), torch.arange(10).repeat(3, 1)):
        with pytest.raises(ValueError, match="position_ids"):
            model(ids, position_ids=pos)
    for fn in (model, model.model):  # an unbatched input failed with IndexError / a size mismatch in a norm
        with pytest.raises(ValueError, match=r"input_ids must be \[B, T\]"):
            fn(ids[0])
        with pytest.raises(ValueError, match=r"inputs_embeds must be \[B, T, hidden_size\]"):
            fn(inputs_embeds=emb[0])
        with pytest.raises(ValueError, match=r"inputs_embeds must be \[B, T, hidden_size\] = \[\*, \*, 48\]"):
            fn(inputs_embeds=emb[..., :40])  # failed in an RMSNorm's multiply


def test_labels_of_any_integer_dtype_and_a_float64_loss():
    # int32 labels (NumPy token files) failed in cross_entropy ("expected target dtype to be Long"), float
    # labels with it, naming no argument; a float64 model's loss was rounded to float32
    model = tiny_model()
    ids = torch.randint(0, V, (2, 10))
    labels = ids.clone()
    labels[:, :4] = -100
    loss = model(ids, labels=labels).loss
    for dtype in (torch.int32, torch.int16):
        assert torch.equal(model(ids, labels=labels.to(dtype)).loss, loss)
    for bad in (labels.float(), labels > 0, labels.tolist()):
        with pytest.raises(ValueError, match="labels must be a tensor of integer token ids"):
            model(ids, labels=bad)
    m64 = tiny_model(dtype=torch.float64)
    out = m64(ids, labels=labels)
    logits = m64(ids).logits[:, 3:-1]
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels[:, 4:].reshape(-1))
    assert out.loss.dtype == torch.float64 and (out.loss - ref).abs() < 1e-12


@pytest.mark.parametrize("mode", ["orthros", "full"])
def test_bf16_autocast_forward_backward(mode):
    # fp32 norm and scale-offset parameters must not promote bf16 activations under autocast
    model = tiny_model(qk_norm=True, attention_mode=mode).train()
    ids = torch.randint(0, V, (2, 20))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and model.model.layers[0].self_attn.q_proj.weight.grad is not None


def test_return_dict_false_returns_tuples():
    # HF's convention: `loss, logits = model(ids, labels=ids, return_dict=False)[:2]` unpacked the
    # output dataclass's keys (loss == "loss") where transformers' models return a tuple
    model = tiny_model()
    ids = torch.randint(0, V, (2, 10))
    ref = model(ids, labels=ids)
    out = model(ids, labels=ids, return_dict=False)
    assert isinstance(out, tuple) and len(out) == 3
    loss, logits, _ = out
    torch.testing.assert_close(loss, ref.loss)
    torch.testing.assert_close(logits, ref.logits)
    hidden = model.model(ids, return_dict=False)
    assert isinstance(hidden, tuple) and hidden[0].shape == (2, 10, model.config.hidden_size)
    model.config.return_dict = False  # the config's default, as in transformers
    assert isinstance(model(ids), tuple) and isinstance(model.model(ids), tuple)
    assert not isinstance(model(ids, return_dict=True), tuple)
    out = model.generate(ids, max_new_tokens=3, do_sample=False, use_engine=False)
    assert out.shape == (2, 13)


@pytest.mark.parametrize("mode", ["orthros", "full", "window"])
def test_single_token_with_labels_has_no_targets(mode):
    """T = 1 with labels: no position has a next token, so no output token exists; the forward,
    the (zero) loss and backward still work (found by the GPU run: the last layer's empty
    output stream could not be reshaped)."""
    m = tiny_model(attention_mode=mode)
    ids = torch.randint(0, m.config.vocab_size, (2, 1))
    r = m(ids, labels=ids)
    assert r.loss.item() == 0.0 and r.logits.shape[1] == 0
    r.loss.backward()
    assert m(ids).logits.shape == (2, 1, m.config.vocab_size)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_stream_queries_equal_per_stream_queries(qk_norm):
    """Both streams' queries in one pass (decode pair, prefill's last chunk) equal each stream's
    queries computed separately: same projection, q-norm, scale-offset and RoPE."""
    m = tiny_model(qk_norm=qk_norm)
    attn = m.model.layers[0].self_attn
    with torch.no_grad():
        for p in attn.scale_offset_params().values():
            p.add_(0.3 * torch.randn_like(p))
        x = torch.randn(2, 7, m.config.hidden_size)
        pos = torch.arange(10, 15).view(1, 5)
        rope = m.model.rotary_emb(pos)
        rope_out = (rope[0][:, -1:], rope[1][:, -1:])  # output tokens sit at the last base position
        both = attn.stream_queries(x, 5, rope, rope_out)
        want = torch.cat([attn.queries(x[:, :5], rope, "base"),
                          attn.queries(x[:, 5:], (rope_out[0].expand(-1, 2, -1), rope_out[1].expand(-1, 2, -1)),
                                       "out")], dim=1)
        torch.testing.assert_close(both, want)
        torch.testing.assert_close(attn.stream_queries(x[:, 5:], 0, rope_out, rope_out),
                                   attn.queries(x[:, 5:], rope_out, "out"))
    with pytest.raises(ValueError, match="stream"):
        attn.queries(x, rope, "both")


def test_generate_in_training_mode_with_gradient_checkpointing_keeps_the_cache():
    """generate() of a model in training mode with gradient checkpointing on (an eval during training)
    gave other tokens than in eval mode: the forward turned the cache off, and generate fed one token a step
    to a model that had forgotten the prompt. Without gradients nothing is checkpointed, as in transformers'
    layers; with them the cache is still off."""
    import warnings

    m = tiny_model().eval()
    ids = torch.randint(0, m.config.vocab_size, (2, 10))
    want = m.generate(ids, max_new_tokens=6, do_sample=False, use_engine=False)
    m.gradient_checkpointing_enable()
    m.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = m.generate(ids, max_new_tokens=6, do_sample=False, use_engine=False)
        assert torch.equal(got, want) and m.training
        assert m(ids, labels=ids, use_cache=True).past_key_values is None  # training: no cache


@torch.no_grad()
def test_generate_with_a_generation_config_that_leaves_use_cache_unset():
    """``generate(ids, generation_config=GenerationConfig(max_new_tokens=8))``: transformers 5 leaves
    the config's ``use_cache`` at None (unset: the model's setting, else True), which read as False,
    so no OrthrosCache was made and transformers' DynamicCache failed with ``KeyError:
    'orthros_attention'`` (a helper's finding)."""
    from transformers import GenerationConfig

    model = tiny_model()
    ids = torch.randint(1, V, (2, 6))
    ref = model.generate(ids, max_new_tokens=8, do_sample=False, use_engine=False)
    out = model.generate(ids, generation_config=GenerationConfig(max_new_tokens=8, do_sample=False), use_engine=False)
    assert torch.equal(out, ref)


@torch.no_grad()
def test_generate_reads_a_positional_generation_config():
    """``generate(ids, GenerationConfig(...))`` (its second parameter, by position) was not read for
    ``cache_implementation`` / ``use_cache``: a "dynamic" one failed with transformers' "Passing both
    `cache_implementation` ... and `cache`", "static" was not refused by name, and ``use_cache=False``
    still generated with an OrthrosCache. Positional and keyword configs now act alike."""
    from transformers import GenerationConfig

    model = tiny_model()
    ids = torch.randint(1, V, (2, 6))
    ref = model.generate(ids, max_new_tokens=4, do_sample=False, use_engine=False)
    out = model.generate(ids, GenerationConfig(max_new_tokens=4, cache_implementation="dynamic"), use_engine=False)
    assert torch.equal(out, ref)
    with pytest.raises(ValueError, match="cache_implementation='static' is not supported"):
        model.generate(ids, GenerationConfig(max_new_tokens=4, cache_implementation="static"), use_engine=False)
    caches, forward = [], model.model.forward
    model.model.forward = lambda *a, **k: caches.append(k.get("past_key_values")) or forward(*a, **k)
    out = model.generate(ids, GenerationConfig(max_new_tokens=4, use_cache=False), use_engine=False)
    assert torch.equal(out, ref) and caches == [None] * 4


@torch.no_grad()
def test_generate_with_only_a_generation_config_gets_no_deprecation_warning(monkeypatch):
    """generate() set ``cache_implementation=None`` among the arguments on every call, so
    ``generate(ids, generation_config=...)`` alone was told "Passing `generation_config` together with
    generation-related arguments=({'cache_implementation'}) is deprecated": an argument the user never
    passed. It is set only where a "dynamic" cache_implementation would be refused beside the cache."""
    import transformers.generation.utils as gen_utils
    from transformers import GenerationConfig

    said = []
    monkeypatch.setattr(gen_utils.logger, "warning_once", lambda msg, *a, **k: said.append(msg))
    model = tiny_model()
    ids = torch.randint(1, V, (2, 6))
    ref = model.generate(ids, max_new_tokens=4, do_sample=False, use_engine=False)
    out = model.generate(ids, generation_config=GenerationConfig(max_new_tokens=4, do_sample=False), use_engine=False)
    assert torch.equal(out, ref)
    assert not [m for m in said if "together with generation-related" in m], said


@pytest.mark.parametrize("kind", ["orthros", "full", "orthros-h"])
def test_right_padding_gives_each_row_its_own_outputs(kind):
    """Was: a right-padded batch (tokenizers' default padding side: tokenizer(texts, padding=True), HF's
    collators) was refused, so training and scoring code written for HF models failed on Orthros. Under causal
    attention every real token's logits and loss are what the row gives alone; no cache holds the pads."""
    from orthros.kinds import hybrid_layout

    over = hybrid_layout("orthros-h", 4) if kind == "orthros-h" else dict(attention_mode=kind)
    if kind == "orthros-h":
        over.update(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                    linear_value_head_dim=6)
    model = tiny_model(**over)
    torch.manual_seed(1)
    rows = [torch.randint(3, V, (n,)) for n in (11, 6, 1)]
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    labels = torch.full((len(rows), T), -100)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)], labels[i, :len(r)] = r, 1, r
    with torch.no_grad():
        out = model(ids, attention_mask=mask)
        assert out.past_key_values is None
        loss = model(ids, attention_mask=mask, labels=labels).loss
        losses, counts = [], []
        for i, r in enumerate(rows):
            torch.testing.assert_close(out.logits[i, :len(r)], model(r[None]).logits[0], atol=1e-5, rtol=1e-5)
            if len(r) > 1:
                losses.append(model(r[None], labels=r[None]).loss * (len(r) - 1))
                counts.append(len(r) - 1)
    torch.testing.assert_close(loss, sum(losses) / sum(counts), atol=1e-5, rtol=1e-5)


def test_forward_names_input_ids_outside_the_vocabulary():
    """An id >= vocab_size or < 0 failed in the embedding with torch's bare "IndexError: index out of range
    in self", a float / bool id tensor with an error naming the embedding's `indices`, a list with an
    AttributeError; uint16 ids (a token file's) failed in the embedding. (CPU ids: CUDA ids are not read.)"""
    model = tiny_model()
    ids = torch.randint(0, V, (2, 5))
    for fn in (model, model.model):
        for bad in (V, -1, V + 7):
            x = ids.clone()
            x[1, 3] = bad
            with pytest.raises(ValueError, match=rf"input_ids has token ids outside the vocabulary "
                                                 rf"\[0, vocab_size={V}\): input_ids\[1, 3\] = {bad}$"):
                fn(x)
        for dtype in (torch.float32, torch.bool):
            with pytest.raises(TypeError, match=f"input_ids must be integer token ids, got {dtype}"):
                fn(ids.to(dtype))
        with pytest.raises(TypeError, match=r"input_ids must be a torch.Tensor \[B, T\], got list"):
            fn(ids.tolist())
    want = model(ids).logits
    for dtype in (torch.int32, torch.uint16):
        assert torch.equal(model(ids.to(dtype)).logits, want)


def test_forward_takes_every_integer_dtype_of_input_ids():
    """int16 / int8 / uint8 ids passed the dtype check and failed in the embedding with torch's "Expected
    tensor for argument #1 'indices' to have one of the following scalar types: Long, Int"."""
    model = tiny_model()
    ids = torch.tensor([[1, 2]])
    want = model(ids).logits
    for dtype in (torch.int16, torch.int8, torch.uint8, torch.uint32, torch.uint64):
        assert torch.equal(model(ids.to(dtype)).logits, want), dtype


def test_labels_outside_the_vocabulary_are_named():
    """A label >= vocab_size or negative other than -100 failed in cross_entropy with "IndexError: Target 97
    is out of bounds", naming no argument (CPU labels: CUDA labels are not read)."""
    model = tiny_model()
    ids = torch.randint(0, V, (2, 6))
    for bad in (V, -1, -5):
        labels = ids.clone()
        labels[1, 4] = bad
        with pytest.raises(ValueError, match=rf"^labels must be token ids in \[0, vocab_size={V}\) or -100 "
                                             rf"\(not scored\), got labels\[1, 4\] = {bad}$"):
            model(ids, labels=labels)
    labels = ids.clone()
    labels[:, :2] = -100
    assert torch.isfinite(model(ids, labels=labels).loss)


def test_position_ids_that_are_not_integers_are_refused():
    """Float position_ids were cut to integers (0.5 -> 0), bools taken as 0 / 1, without a word."""
    model = tiny_model()
    ids = torch.randint(0, V, (2, 6))
    for pos in (torch.arange(6) * 0.5, torch.ones(6, dtype=torch.bool), torch.arange(6.0)):
        for fn in (model, model.model):
            with pytest.raises(ValueError, match=f"^position_ids must be integers, got {pos.dtype}$"):
                fn(ids, position_ids=pos)
    torch.testing.assert_close(model(ids, position_ids=torch.arange(6, dtype=torch.int32)).logits, model(ids).logits)


@torch.no_grad()
@pytest.mark.parametrize("value", [0.5, 1.5, 2, float("nan")])
def test_an_attention_mask_of_values_other_than_0_and_1_is_refused_not_cut(value):
    """.long() cut a float mask's 0.5 to 0 (that token taken as padding: a row of 0.5 lost every key) and 1.5 to 1,
    without a word; in generate too."""
    model = tiny_model()
    ids = torch.randint(0, V, (2, 6))
    mask = torch.ones(2, 6)
    mask[1, 3] = value
    for call in (lambda: model(ids, attention_mask=mask), lambda: model.model(ids, attention_mask=mask),
                 lambda: model.generate(ids, attention_mask=mask, max_new_tokens=2)):
        with pytest.raises(ValueError, match=r"^attention_mask must hold 1 \(token\) and 0 \(padding\) only, got "):
            call()
    left = torch.tensor([[1.0] * 6, [0.0, 0.0] + [1.0] * 4])  # a float or bool mask of 0 / 1 is taken as before
    for m in (left, left.bool()):
        torch.testing.assert_close(model(ids, attention_mask=m).logits, model(ids, attention_mask=left.long()).logits)


@torch.no_grad()
@pytest.mark.parametrize("mask,match", [
    (torch.ones(2, 5, dtype=torch.long), r"\(2, 5\)"),  # named position_ids
    (torch.ones(2, 7, dtype=torch.long), r"\(2, 7\)"),  # ran: transformers drops an all-ones mask
    (torch.ones(1, 6, dtype=torch.long), r"\(1, 6\)"),  # ran
    (torch.ones(6, dtype=torch.long), r"\(6,\)"),  # IndexError in transformers
])
def test_generate_refuses_an_attention_mask_of_another_shape_by_name(mask, match):
    model = tiny_model()
    ids = torch.randint(0, V, (2, 6))
    with pytest.raises(ValueError, match=r"^attention_mask must be \[B, T\] like input_ids = \[2, 6\], got shape " + match):
        model.generate(ids, attention_mask=mask, max_new_tokens=2)
    with pytest.raises(TypeError, match=r"^attention_mask must be a torch.Tensor .* got list"):  # AttributeError
        model.generate(ids, attention_mask=[[1] * 6] * 2, max_new_tokens=2)


@torch.no_grad()
def test_inputs_embeds_of_no_float_or_a_wider_dtype_are_refused_by_name():
    """Integer / bool inputs_embeds ran as embeddings; float64 ones in a float32 model (float32 in bfloat16) failed
    in the first projection with "expected m1 and m2 to have the same dtype"."""
    model = tiny_model()
    emb = model.model.embed_tokens(torch.randint(0, V, (2, 6)))
    for fn in (model, model.model):
        for bad in (emb.long(), emb > 0):
            with pytest.raises(TypeError, match=f"^inputs_embeds must be a floating tensor .* got {bad.dtype}$"):
                fn(inputs_embeds=bad)
        with pytest.raises(ValueError, match=r"^inputs_embeds must be of the model's dtype torch.float32 .* got "
                                             r"torch.float64"):
            fn(inputs_embeds=emb.double())
    with pytest.raises(ValueError, match="inputs_embeds must be of the model's dtype torch.bfloat16"):
        tiny_model(dtype=torch.bfloat16)(inputs_embeds=emb)
    assert model(inputs_embeds=emb.bfloat16()).logits.dtype == torch.float32  # narrower: promoted, as before
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts them
        assert torch.isfinite(tiny_model(dtype=torch.bfloat16)(inputs_embeds=emb).logits).all()


@torch.no_grad()
def test_positions_torch_cannot_read_are_refused_by_name():
    """A string or a list with None in it as positions failed in torch.as_tensor (TypeError "new(): invalid data
    type 'str'", RuntimeError "Could not infer dtype of NoneType"), naming no argument."""
    model = tiny_model()
    ids = torch.randint(0, V, (1, 6))
    for bad in ("ab", [1, None]):
        for name in ("output_positions", "position_ids", "attention_mask"):
            for fn in (model, model.model):
                with pytest.raises(ValueError, match=f"^{name} must be .* got {type(bad).__name__} "):
                    fn(ids, **{name: bad})
        with pytest.raises(ValueError, match=f"^cu_seqlens must be .* got {type(bad).__name__} "):  # with labels
            model(ids, labels=ids, cu_seqlens=bad)


@pytest.mark.parametrize("kw", [dict(rope_parameters="default"), dict(rope_parameters=[("rope_theta", 1e4)]),
                                dict(rope_scaling="linear")])
def test_rope_parameters_that_are_no_dict_are_refused_by_name(kw):
    """dict() of them failed with "dictionary update sequence element #0 ..." naming no field."""
    name = next(iter(kw))
    with pytest.raises(ValueError, match=rf"^OrthrosConfig.{name} must be a dict .* got "):
        tiny_config(**kw)
    config = tiny_config()
    config.rope_parameters = "default"  # set after __init__: an AttributeError ('str' object has no attribute 'get')
    with pytest.raises(ValueError, match=r"^OrthrosConfig.rope_parameters must be a dict"):
        OrthrosForCausalLM(config)


@torch.no_grad()
def test_a_use_cache_that_is_no_bool_is_refused_by_name():
    """use_cache="false" was taken by its truth value: a cache was made and returned (the config refuses it)."""
    model = tiny_model()
    ids = torch.randint(0, V, (1, 4))
    for fn in (model, model.model):
        with pytest.raises(ValueError, match=r"^use_cache must be None \(config.use_cache\), True or False, got 'false'"):
            fn(ids, use_cache="false")
    assert model(ids, use_cache=0).past_key_values is None  # 0 / 1 are False / True
