"""LoRA on a policy: the adapters (peft), RL's frozen reference adapter inside the same model,
and the compute dtype of the training forwards.

Compute on a 16-bit base (bf16 on CUDA): the adapters keep float32 master weights (peft's
default, so AdamW's states and the updates stay float32: a 1e-5 step on a bf16 weight would
round away), but the training forwards run under `torch.autocast(bfloat16)` with peft's input
casting off (`lora_compute`): peft would otherwise cast every LoRA input to float32 and autograd
would keep that copy (321 against 211 kB per token per layer measured on a Qwen2.5-7B layer,
rcgrpo.training.plan.measure).

.venv/bin/pytest tests/test_rl_memory.py -q   # the reference adapter; bf16 compute vs float32
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

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


def compute_dtype(model):
    """The 16-bit dtype the LoRA path of a training forward runs in, or None (float32 base, or
    no LoRA): the dtype of the frozen base weights when its adapters are float32."""
    import torch

    base = {
        p.dtype for n, p in model.named_parameters() if "lora_" not in n and p.is_floating_point()
    }
    lora = {p.dtype for n, p in model.named_parameters() if "lora_" in n}
    half = base & {torch.bfloat16, torch.float16}
    return next(iter(half)) if half and torch.float32 in lora else None


def lora_compute(model):
    """The context of a training forward AND its backward (a checkpointed layer recomputes in
    backward): LoRA in the base's 16-bit dtype with float32 master weights (autocast, peft's
    input casting off), or nothing for a float32 or full fine-tuned model."""
    dtype = compute_dtype(model)
    if dtype is None:
        return nullcontext()
    return _autocast(model, dtype)


@contextmanager
def _autocast(model, dtype):
    import torch
    from peft.helpers import disable_input_dtype_casting

    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=dtype), disable_input_dtype_casting(model):
        yield


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
