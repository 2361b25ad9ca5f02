"""The optimizer and learning rate a stage trains with: one per training mode (LoRA or full fine-tuning).

The paper's rates (RCTP-FT 1e-5, RC-GRPO 1e-6) are full fine-tuning rates. LoRA's best rate is
about 10x full fine-tuning's, in supervised fine-tuning and in RL alike ("LoRA Without Regret",
Schulman et al., Thinking Machines, 2025); the 7B profiles train LoRA r=16, so the paper preset
sets `lr_lora` to 10x the paper's `lr` (params.yaml). `lr_lora: 0` means `lr` for both modes.

    .venv/bin/pytest tests/test_lifecycle.py -q -k learning_rate
"""

from __future__ import annotations

import torch


def adamw(model, cfg, weight_decay: float = 0.0) -> tuple[list, torch.optim.AdamW]:
    """(the model's trainable parameters, AdamW over them at the mode's learning rate)."""
    params = [p for p in model.parameters() if p.requires_grad]
    lr = learning_rate(cfg, hasattr(model, "peft_config"))
    return params, torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


def learning_rate(cfg, lora: bool) -> float:
    """cfg.lr_lora for a LoRA policy when it is set, else cfg.lr (SFTConfig, RLConfig)."""
    return cfg.lr_lora if lora and cfg.lr_lora > 0 else cfg.lr
