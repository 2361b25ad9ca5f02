"""A policy as an inference server loads it (vLLM): the base with the reward-token rows, and the
LoRA matrices alone.

    .venv/bin/pytest tests/test_models.py -q -k export
"""

from __future__ import annotations

import json
from pathlib import Path

from rcgrpo.chat.record import REWARD_TOKENS
from rcgrpo.models.loading import Policy, register_tokens
from rcgrpo.models.sources import base_source, model_config


def reward_rows(policy: Policy):
    """The current input-embedding rows of the reward tokens, (2, d), as the model sees them
    (peft's trainable-token delta included)."""
    import torch

    ids = torch.tensor(list(policy.reward_token_ids.values()), device=policy.config.device)
    with torch.no_grad():
        return policy.model.get_input_embeddings()(ids).detach().cpu()


def head_rows(policy: Policy):
    """The LM-head rows of the reward tokens, (2, d), or None when the head is tied to the input
    embedding (then reward_rows are both)."""
    import torch

    emb, out = policy.model.get_input_embeddings(), policy.model.get_output_embeddings()
    if out is None or _stored(out).data_ptr() == _stored(emb).data_ptr():
        return None
    with torch.no_grad():
        return out.weight[list(policy.reward_token_ids.values())].detach().cpu()


def _stored(module):
    """The weight a layer stores. peft's trainable-token wrapper computes `.weight` afresh on
    each access (base + delta), so two reads of a tied pair are two tensors whose addresses
    only match when the allocator happens to reuse one: compare what lies under the wrapper."""
    while hasattr(module, "token_adapter"):
        module = module.token_adapter.base_layer
    return module.weight


def export_for_serving(policy: Policy, folder: str | Path) -> Path:
    """A plain transformers folder an inference server (vLLM) loads: the base weights with the
    reward tokens registered and their rows (input embedding, and an untied LM head) set to the
    policy's current ones, the tokenizer, and for a full fine-tune all trained weights. LoRA
    weights go separately (export_lora)."""
    import torch

    folder = Path(folder)
    if policy.is_lora:
        from transformers import AutoModelForCausalLM

        source = base_source(policy.config)
        base = AutoModelForCausalLM.from_pretrained(
            source,
            config=model_config(policy.config, source),
            dtype=getattr(torch, policy.config.dtype),
        )
        register_tokens(policy.tokenizer, base, list(REWARD_TOKENS))
        with torch.no_grad():
            rows = reward_rows(policy).to(base.dtype)
            emb = base.get_input_embeddings().weight
            ids = list(policy.reward_token_ids.values())
            emb[ids] = rows
            out = base.get_output_embeddings().weight
            if (head := head_rows(policy)) is not None and out.data_ptr() != emb.data_ptr():
                out[ids] = head.to(base.dtype)
        base.save_pretrained(folder)
    else:
        policy.model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    return folder


def export_lora(policy: Policy, folder: str | Path) -> Path:
    """The LoRA A/B matrices alone in peft's adapter format (what vLLM's LoRARequest loads);
    the reward-token rows live in the served base (export_for_serving)."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(policy.model, save_embedding_layers=False)
    lora = {k: v.detach().cpu().contiguous() for k, v in state.items() if "lora_" in k}
    save_file(lora, str(folder / "adapter_model.safetensors"))
    config = policy.model.peft_config["default"].to_dict()
    config["trainable_token_indices"] = None
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1, default=list))
    return folder
