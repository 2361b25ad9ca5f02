"""The `tiny` profile's tokenizer and architecture: built offline, seeded, in seconds.

The tokenizer is a byte-level BPE (GPT-2 style: any byte string round-trips) trained with the
`tokenizers` library on BFCL text of the *train* split only: the function docs of the 8 API
classes (full JSON and the compact signature lines the tiny prompt uses), the user questions and
the ground-truth calls. Training is deterministic for a fixed corpus order, and `models.py`
caches the result under `cache/models/` so every process sees the same ids.

The model is a 2-layer Qwen2 (~1M parameters with the default sizes) so that dataset building,
RCTP-FT, RC-GRPO and evaluation together fit in minutes on 2 CPU cores. It is random at start:
the tiny profile exercises the whole pipeline, it is not meant to solve BFCL.

    .venv/bin/python -c "from rcgrpo.models.tiny import train_tokenizer; print(train_tokenizer().get_vocab_size())"
"""

from __future__ import annotations

import json

from rcgrpo.bfcl.tasks import FUNC_DOC_FILES, class_docs, tasks_in

# ChatML control tokens: the project chat template is ChatML; <|endoftext|> pads.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 4096  # BPE merges stop here; the reward tokens are added later by models.py

# Qwen2 architecture of the tiny profile (transformers Qwen2Config keywords). The vocabulary size
# is filled in from the tokenizer. Attention with 4 query / 2 key-value heads keeps GQA (the real
# Qwen2.5 layout) in the code path.
ARCHITECTURE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}


def corpus() -> list[str]:
    """Training text in a fixed order (the order matters for BPE ties, so never a set)."""
    from rcgrpo.chat.prompts import compact_signature  # pure text helper

    texts: list[str] = []
    for cls in sorted(FUNC_DOC_FILES):
        for doc in class_docs(cls):
            texts.append(json.dumps(doc))
            texts.append(compact_signature(doc))
    for task in tasks_in("train"):
        for turn in task.turns:
            texts.extend(m["content"] for m in turn)
        for turn in task.ground_truth:
            if turn:
                texts.append("[" + ", ".join(turn) + "]")
    return texts


def train_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A `tokenizers.Tokenizer` (byte-level BPE) trained on `corpus()`; deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is <unk>
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer
