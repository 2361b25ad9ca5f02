"""Loading and saving a policy: the one place transformers builds a model (peft in models/lora.py).

`load_policy(cfg)` gives a causal LM + tokenizer with the two reward tokens registered as special
tokens (one id each; new embedding rows = the mean embedding), a chat template that renders
`tools=` (the model's own if it does, else the project's ChatML template), and, if configured,
LoRA adapters (models/lora.py; the reward-token rows trained too through peft's
`trainable_token_indices`, since frozen mean rows would make <|high_reward|> and <|low_reward|>
the same input), and gradient checkpointing (on by default for the 7B/8B profiles: recomputing
each layer in backward keeps one layer's activations instead of all). `save_policy` writes
adapter (or full weights) + tokenizer; `load_policy(cfg, adapter_path=...)` reloads them.
What `model.device`, `model.dtype` and `model.attention: auto` mean is rcgrpo.models.device;
`finish_policy` is everything after the weights are loaded, for
a caller that builds its own model (scripts/gpu_paper_step.py: a randomly initialised 7B).

    .venv/bin/python -c "from rcgrpo.models.loading import *; from rcgrpo.models.profiles import ModelConfig; print(load_policy(ModelConfig()))"
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcgrpo.chat.prompts import PROJECT_TEMPLATE
from rcgrpo.chat.record import REWARD_TOKENS
from rcgrpo.models.device import attention_implementation, resolve
from rcgrpo.models.profiles import POLICY_FILE, PROFILES, ModelConfig
from rcgrpo.models.sources import base_source, model_config
from rcgrpo.runtime import replace_dir


@dataclass
class Policy:
    """A loaded policy. `model` is a transformers model or a peft PeftModel around one."""

    model: Any
    tokenizer: Any
    reward_token_ids: dict[str, int]  # {"<|high_reward|>": id, "<|low_reward|>": id}
    stop_id: int  # end-of-message token of the chat template (<|im_end|>, <|eot_id|>)
    config: ModelConfig  # as resolved: a concrete device and dtype (never "auto")
    name: str  # profile name or path, for provenance
    compact_docs: bool
    also_stop: tuple[int, ...] = ()  # other tokens that end a sampled message (<|eom_id|>)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Every token that ends a sampled message: the template's, then the others."""
        return (self.stop_id, *self.also_stop)

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    def save(self, path: str | Path) -> Path:
        return save_policy(self, path)

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        return f"Policy({self.name}, {n / 1e6:.2f}M params, lora={self.is_lora})"


def _renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's own chat template shows a tool passed in `tools=`."""
    if not tokenizer.chat_template:
        return False
    probe = {"type": "function", "function": {"name": "zz_probe_tool", "parameters": {}}}
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=[probe], tokenize=False
        )
    except Exception:  # a template that raises on tools= does not support them
        return False
    return "zz_probe_tool" in text


def register_tokens(tokenizer, model, tokens: list[str], also_new: tuple[str, ...] = ()) -> None:
    """Add missing tokens as special tokens; the rows of tokens new to the weights = the mean
    base row, in the input embedding and an untied head. A padded vocabulary (Qwen2.5: 152,064
    rows for 151,665 tokens) already has rows for them: those spare rows are set too, not left
    as they were. New = added now, beyond the old matrix, or in `also_new` (a saved tokenizer
    that already holds them over fresh base weights)."""
    import torch
    from tokenizers import AddedToken

    missing = [t for t in tokens if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], True)
    old = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > old:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    new = {tokenizer.convert_tokens_to_ids(t) for t in [*missing, *also_new] if t in tokens}
    new = sorted(new | set(range(old, len(tokenizer))))
    if not new:
        return
    first = new[0]  # rows below the first new id are the base's own tokens
    with torch.no_grad():
        emb = model.get_input_embeddings().weight  # (V, d)
        emb[new] = emb[:first].mean(0)
        out = model.get_output_embeddings()
        if out is not None and out.weight.data_ptr() != emb.data_ptr():  # untied head
            out.weight[new] = out.weight[:first].mean(0)


# Tokens that end an assistant message, the chat template's own first. Llama 3.1 in its tool
# ("Environment: ipython") mode ends a tool call with <|eom_id|> (end of message: a tool result
# follows) instead of <|eot_id|>; without it as a stop token, sampling ran on past the call.
STOP_TOKENS = ("<|im_end|>", "<|eot_id|>")
ALSO_STOP = ("<|eom_id|>",)


def stop_tokens(tokenizer) -> tuple[int, tuple[int, ...]]:
    """(the template's end-of-message id, the other ids that end a sampled message)."""
    vocab = tokenizer.get_vocab()
    stop = next(t for t in STOP_TOKENS if t in vocab)
    also = tuple(tokenizer.convert_tokens_to_ids(t) for t in ALSO_STOP if t in vocab)
    return tokenizer.convert_tokens_to_ids(stop), also


def load_policy(cfg: ModelConfig, adapter_path: str | Path | None = None) -> Policy:
    """Load the base model of `cfg`, register the reward tokens, fix the chat template, and
    apply LoRA; with `adapter_path` (a save_policy folder) restore what was trained there."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = resolve(cfg)
    adapter = Path(adapter_path) if adapter_path else None
    if adapter is not None and not (adapter / POLICY_FILE).exists():
        raise FileNotFoundError(
            f"{adapter} is not a saved policy (no {POLICY_FILE}): pass a folder written by "
            "rcgrpo.models.loading.save_policy"
        )
    source = base_source(cfg)
    full = adapter is not None and not json.loads((adapter / POLICY_FILE).read_text())["lora"]
    weights = str(adapter) if full else source  # a full fine-tune reloads all its weights
    # straight onto this process's GPU (under a launcher: its own, cuda:LOCAL_RANK), never
    # through another device first
    device_map = cfg.device if cfg.device.startswith("cuda") else None
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(adapter) if adapter else source)
        train_attention = attention_implementation(cfg)
        model = AutoModelForCausalLM.from_pretrained(
            weights,
            config=model_config(cfg, weights),
            dtype=getattr(torch, cfg.dtype),
            attn_implementation="sdpa" if "flash" in train_attention else train_attention,
            device_map=device_map,
        )
        model.training_attention = train_attention  # what the trainers' updates run with
    except OSError as e:
        raise FileNotFoundError(
            f"could not load model {weights!r} for profile {cfg.profile!r} ({e}). A hub id is "
            "downloaded into the HF cache unless HF_HUB_OFFLINE=1 or the hub is unreachable: "
            "download it on a connected machine, or set model.path to a local folder"
        ) from None
    # the saved policy, not the config, says whether it is LoRA
    lora_path = adapter if adapter is not None and not full else None
    return finish_policy(model, tokenizer, cfg, lora_path, reload=adapter is not None)


def finish_policy(
    model, tokenizer, cfg: ModelConfig, lora_path: Path | None = None, reload: bool = False
) -> Policy:
    """Everything after the weights: the chat template, the reward tokens, gradient
    checkpointing, LoRA (a fresh adapter, or the one saved at lora_path), the device.
    reload: the tokenizer and weights come from a saved policy (its reward tokens already
    registered in the tokenizer; over fresh base weights their rows are new)."""
    cfg = resolve(cfg)
    profile = PROFILES[cfg.profile]
    use_lora = lora_path is not None or (
        not reload and (profile.lora if cfg.lora is None else cfg.lora)
    )
    if not _renders_tools(tokenizer):
        tokenizer.chat_template = PROJECT_TEMPLATE
    native = tokenizer.chat_template != PROJECT_TEMPLATE
    # A LoRA reload: the saved tokenizer has the reward tokens, the base weights are fresh.
    also_new = REWARD_TOKENS if lora_path is not None else ()
    register_tokens(
        tokenizer, model, [*REWARD_TOKENS, *(() if native else ("<|im_end|>",))], also_new
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    reward_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in REWARD_TOKENS}
    stop_id, also_stop = stop_tokens(tokenizer)
    checkpointing = profile.gradient_checkpointing
    if cfg.gradient_checkpointing is not None:
        checkpointing = cfg.gradient_checkpointing
    if checkpointing:  # acts in train mode only: rollouts and evaluation (eval mode) are unchanged
        # non-reentrant: works under peft without enable_input_require_grads (frozen embeddings)
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable({"use_reentrant": False})
        else:  # transformers before the rename (5.17 on the lent GPU box)
            model.gradient_checkpointing_enable({"use_reentrant": False})
    if use_lora:
        if lora_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(lora_path), is_trainable=True)
        else:
            from rcgrpo.models.lora import apply_lora

            model = apply_lora(model, cfg, list(reward_ids.values()))
    model.to(cfg.device)
    return Policy(
        model=model,
        tokenizer=tokenizer,
        reward_token_ids=reward_ids,
        stop_id=stop_id,
        config=cfg,
        name=cfg.path or cfg.profile,
        compact_docs=profile.compact_docs if cfg.compact_docs is None else cfg.compact_docs,
        also_stop=also_stop,
    )


def save_policy(policy: Policy, path: str | Path, training: dict | None = None) -> Path:
    """Write the adapter (LoRA) or all weights (full fine-tune), the tokenizer (reward tokens,
    chat template) and the ModelConfig; reload with load_policy(cfg, adapter_path=path).
    training: how the weights were trained ({"stage", "protocol", ...}); evaluation reads the
    protocol from it (`trained_protocol`)."""
    import os
    import shutil

    # written to a sibling temp folder, then renamed over `path`: a failed save keeps the old one
    final, path = Path(path), Path(path).with_name(f".{Path(path).name}.tmp-{os.getpid()}")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    if policy.is_lora:
        # The resized embedding matrix is not saved (GBs on 7B): load_policy rebuilds its new
        # rows (the mean) and the trained reward-token rows are in the adapter.
        # the trained adapter only, not the RL reference adapter (add_reference_adapter)
        policy.model.save_pretrained(
            path, save_embedding_layers=False, selected_adapters=[policy.model.active_adapter]
        )
    else:
        policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)
    meta = {"config": dataclasses.asdict(policy.config), "lora": policy.is_lora}
    meta["training"] = training or {}
    (path / POLICY_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return replace_dir(path, final)


def trained_protocol(path: str | Path) -> str | None:
    """The prompt protocol a saved policy was trained with (None: not recorded, e.g. a base)."""
    meta = Path(path) / POLICY_FILE
    if not meta.exists():
        return None
    return (json.loads(meta.read_text()).get("training") or {}).get("protocol")
