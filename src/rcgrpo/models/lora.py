"""LoRA on a policy: the adapters (peft), and RL's frozen reference adapter inside the same model.

.venv/bin/pytest tests/test_rl_memory.py -q   # the reference adapter against a deep copy
"""

from __future__ import annotations

from contextlib import contextmanager

from rcgrpo.models.profiles import LORA_TARGETS, ModelConfig


def apply_lora(model, cfg: ModelConfig, reward_ids: list[int]):
    import torch
    from peft import LoraConfig, get_peft_model

    targets = cfg.lora_target_modules or LORA_TARGETS.get(model.config.model_type)
    if not targets:
        raise ValueError(
            f"no default LoRA target modules for architecture {model.config.model_type!r}: "
            "set model.lora_target_modules in params.yaml"
        )
    torch.manual_seed(cfg.seed)  # LoRA A matrices are random: seed them
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(targets),
        trainable_token_indices={"embed_tokens": reward_ids} if cfg.train_reward_rows else None,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


REFERENCE_ADAPTER = "reference"  # the frozen RL reference inside a LoRA policy


def add_reference_adapter(model) -> str:
    """Freeze a copy of the active LoRA adapter (and its reward-token rows) under a second name:
    the RL reference is the policy RL starts from, i.e. base + the fine-tuned adapter, so
    `disable_adapter()` (the pre-fine-tuning base, reward-token rows at their mean init) would be
    the wrong model. The copy costs the adapter's size (MBs), not a second base (15 GB on 7B).
    Forward through it inside `using_adapter(model, name)`.

    What trains is left as it was: peft's set_adapter marks every parameter of the adapter it
    activates trainable, which undid a freeze made before (the vLLM engine's frozen reward-token
    rows, freeze_reward_rows: they trained and the server restarted every
    step). So each existing parameter's requires_grad is restored after the switch."""
    import copy

    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

    active = model.active_adapter
    if REFERENCE_ADAPTER in model.peft_config:  # a second trainer on this model: the model now
        model.delete_adapter(REFERENCE_ADAPTER)
    trains = {name: p.requires_grad for name, p in model.named_parameters()}
    model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(model.peft_config[active]))
    state = get_peft_model_state_dict(model, adapter_name=active, save_embedding_layers=False)
    set_peft_model_state_dict(model, state, adapter_name=REFERENCE_ADAPTER)
    model.set_adapter(active)  # add_adapter may switch; the trained adapter stays active
    for name, p in model.named_parameters():
        # the reference never trains; the rest as before the switch
        p.requires_grad_(trains.get(name, False) and f".{REFERENCE_ADAPTER}" not in name)
    return REFERENCE_ADAPTER


@contextmanager
def using_adapter(model, name: str):
    """Run the forward passes inside through adapter `name`, then restore the active adapter
    and every parameter's requires_grad (peft's set_adapter marks the adapter it sets as
    trainable)."""
    active = model.active_adapter
    grads = [p.requires_grad for p in model.parameters()]
    model.set_adapter(name)
    try:
        yield model
    finally:
        model.set_adapter(active)
        for p, g in zip(model.parameters(), grads, strict=True):
            p.requires_grad_(g)


def freeze_reward_rows(policy) -> int:
    """requires_grad off for peft's trainable-token deltas (the reward-token rows); how many.
    RL freezes them under every engine (training.grpo.run): one trainable set whatever serves
    the rollouts (a vLLM server cannot take new rows through a LoRA adapter)."""
    frozen = 0
    for name, p in policy.model.named_parameters():
        if "trainable_tokens" in name and p.requires_grad:
            p.requires_grad_(False)
            frozen += 1
    return frozen
