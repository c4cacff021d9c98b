"""lm-evaluation-harness with Orthros registered.

``lm_eval --model hf --model_args pretrained=PATH`` loads checkpoints through transformers'
Auto classes, which know the ``"orthros"`` model type once ``orthros`` is imported. This
module is ``lm_eval``'s own command line with that import done first::

    python -m orthros.evaluation.harness --model hf --model_args pretrained=PATH \\
        --tasks orthros_tiny_cloze --include_path orthros/evaluation/data/lm_tasks

Loglikelihoods are right for Orthros without any adapter: lm-eval calls ``model(ids).logits``,
and an Orthros forward without labels puts an output-stream token at every position, so the
logits are ``[B, T, V]`` (position t predicts token t+1 through full attention, exactly what a
prefill of tokens 0..t would give).
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    import orthros  # noqa: F401  (registers "orthros" with AutoConfig / AutoModelForCausalLM)

    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        print("lm-evaluation-harness is not installed: pip install lm_eval", file=sys.stderr)
        return 2
    from .lm import _lm_eval_quietly

    if argv is not None:
        sys.argv = [sys.argv[0]] + list(argv)
    with _lm_eval_quietly(progress=True, metadata_hint=True):  # no git 'fatal:' outside a checkout; bars at a terminal
        cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
