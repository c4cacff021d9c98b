"""Train the embedded byte-level BPE tokenizer on the embedded corpus.

Committed output: ``orthros/data/tokenizer/`` (a ``PreTrainedTokenizerFast`` directory with a
ChatML-style chat template). Re-run with ``python -m orthros.data.build_tokenizer``; the
result is deterministic for a given ``tokenizers`` version.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from ..utils import file_in_the_way

HERE = Path(__file__).parent
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte-level alphabet and the special tokens
# ChatML. Each assistant answer is wrapped in {% generation %} so that
# ``return_assistant_tokens_mask`` works too; orthros' own SFT masking does not need it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vocab-size", type=int, default=4096,
                   help=f"tokens in all, at least {MIN_VOCAB} (the 256 byte symbols and the special tokens; "
                        "default: 4096, the shipped tokenizer's)")
    p.add_argument("--out", default=str(HERE / "tokenizer"),
                   help="folder to write the tokenizer to (default: the embedded tokenizer's, replacing the "
                        "shipped files)")
    a = p.parse_args(argv)
    if a.vocab_size < MIN_VOCAB:  # the trainer would quietly give MIN_VOCAB tokens (or fail on a negative size)
        p.error(f"--vocab-size must be >= {MIN_VOCAB} (256 byte symbols + {len(SPECIAL_TOKENS)} special tokens), "
                f"got {a.vocab_size}")
    out = Path(a.out)
    if (blocked := file_in_the_way(out)) is not None:  # OUT, or a folder above it, is a file
        p.error(f"--out {out}: not a folder ({blocked} is a file)")

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    def texts():
        with open(HERE / "corpus" / "shakespeare_train.jsonl", encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)["text"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=a.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=1_000_000,
    )
    fast.chat_template = CHAT_TEMPLATE
    # Saved into a temporary folder beside OUT, then each file moved in: OUT never holds a half-written file.
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        fast.save_pretrained(str(tmp))
        # Name the class every transformers 5.x knows (5.24 writes its new backend name).
        cfg_path = tmp / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
        out.mkdir(parents=True, exist_ok=True)
        for f in sorted(tmp.iterdir()):
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"saved {len(fast)} tokens to {out}")


if __name__ == "__main__":
    main()
