"""Helpers of the vLLM serving tests: tiny checkpoints and the ``generate()`` reference.

Each checkpoint is a tiny fp32 Orthros model built locally (head_dim 32: vLLM's CPU attention
needs head_dim >= 32), with random scale-offset parameters so both streams differ, saved with
the embedded tokenizer (and its chat template). :class:`Reference` gives the greedy tokens of
``OrthrosForCausalLM.generate()``: what vLLM must reproduce exactly.
"""

from __future__ import annotations

import torch

from orthros.serving import CPU_BLOCK_ALIGN

WINDOW = 16
MAX_MODEL_LEN = 256
BLOCK_SIZE = CPU_BLOCK_ALIGN


def _randomise(model, seed: int, matrices: bool = True):
    """Random alpha/beta/alpha'/beta' and (``matrices``) weight matrices of a wider spread than
    the init (clear argmax margins)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("alpha", "alpha_out"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif leaf in ("beta", "beta_out"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif matrices and p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def build_checkpoint(path, *, seed: int = 0, **overrides):
    """A tiny random Orthros checkpoint (safetensors + config + tokenizer) at ``path``."""
    import orthros
    from orthros.data import load_tokenizer

    tok = load_tokenizer()
    kw = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=2, num_key_value_heads=1, head_dim=32, window_size=WINDOW,
              max_position_embeddings=1024, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    kw.update(overrides)
    torch.manual_seed(seed)
    model = orthros.OrthrosForCausalLM(orthros.OrthrosConfig(**kw)).float()
    _randomise(model, seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def build_converted_checkpoint(tmp, *, seed: int = 1):
    """A tiny random Qwen3 (q/k norm, tied embeddings) converted by ``convert_checkpoint``, with
    its alpha/beta then randomised (a converted model starts at 1/0 and is trained)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import orthros
    from orthros.conversion.convert import convert_checkpoint
    from orthros.data import load_tokenizer

    tok = load_tokenizer()
    torch.manual_seed(seed)
    src = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                       head_dim=32, max_position_embeddings=1024, tie_word_embeddings=True,
                                       bos_token_id=None, eos_token_id=None, pad_token_id=None)).float()
    _randomise(src, seed)
    src.save_pretrained(tmp / "qwen3")
    tok.save_pretrained(tmp / "qwen3")
    dst = tmp / "converted"
    convert_checkpoint(tmp / "qwen3", dst, window_size=WINDOW, dtype="fp32")
    model = orthros.OrthrosForCausalLM.from_pretrained(dst, dtype=torch.float32)
    _randomise(model, seed + 100, matrices=False)
    model.save_pretrained(dst)
    return dst


class Reference:
    """Greedy tokens of ``OrthrosForCausalLM.generate()`` (transformers' loop, OrthrosCache)."""

    def __init__(self, path):
        import orthros  # noqa: F401

        self.model = orthros.OrthrosForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self._memo = {}

    def __call__(self, prompt_ids, max_new_tokens: int) -> list:
        key = (tuple(prompt_ids), max_new_tokens)
        if key not in self._memo:
            ids = torch.tensor([list(prompt_ids)])
            with torch.no_grad():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                          min_new_tokens=max_new_tokens, do_sample=False, use_engine=False)
            self._memo[key] = out[0, ids.shape[1]:].tolist()
        return self._memo[key]
