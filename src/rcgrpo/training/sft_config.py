"""The `rctp:` and `sft:` sections of params.yaml: what one fine-tuning stage trains on and how.

Its own module (as RL's is training/grpo/config.py) so the CLI, the run config and `rcgrpo plan`
read a stage's settings without importing the training loop and torch.

    .venv/bin/python -m rcgrpo.cli config show rctp
"""

from __future__ import annotations

from typing import Literal

from rcgrpo.fields import config_class, ranged, setting


@config_class
class SFTConfig:
    """params.yaml `rctp:` and `sft:` sections."""

    mode: Literal["sft", "rctp"] = setting(
        "rctp", "rctp: mixed data + reward goals; sft: experts only, no goal"
    )
    data: str = setting("data/rctp/train.jsonl", "Trajectory JSONL (rcgrpo.chat.record)")
    out_dir: str = setting("outputs/rctp", "checkpoints/, final/ (the adapter or full model)")
    lr: float = ranged(1e-5, "(0, 1]", "AdamW peak learning rate (paper: 1e-5)")
    lr_lora: float = ranged(
        0.0, "[0, 1]", "AdamW peak learning rate of a LoRA policy; 0 = lr (paper preset: 10x lr)"
    )
    batch_size: int = ranged(16, "[1, inf)", "sequences per optimizer step (paper: 16)")
    micro_batch_size: int = ranged(
        4, "[1, inf)", "sequences per forward pass; accumulation = batch / micro"
    )
    max_tokens_per_micro_batch: int = ranged(
        0,
        "[0, inf)",
        "tokens per forward pass, examples sorted by length and packed (sized by rcgrpo plan); "
        "0 = by count",
    )
    epochs: int = ranged(5, "[1, inf)", "passes over the data (paper: 5 for RCTP-FT, 2 for SFT)")
    max_len: int = ranged(
        0,
        "[0, inf)",
        "longest rendered example kept, longer ones are dropped and counted (0 = the profile's "
        "sft_max_len: a cut would lose the last assistant tokens or the system prompt)",
    )
    warmup_ratio: float = ranged(
        0.03, "[0, 1)", "linear warmup fraction of the steps, then linear decay to 0"
    )
    weight_decay: float = ranged(0.0, "[0, 1]", "AdamW weight decay")
    grad_clip: float = ranged(1.0, "[0, inf)", "max global grad norm (0 = off)")
    save_every: int = ranged(
        0, "[0, inf)", "checkpoint every N optimizer steps (0 = only the final model)"
    )
    seed: int = ranged(0, "[0, inf)", "batch order and any dropout")

    def __post_init__(self):
        if self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"batch_size {self.batch_size} must be a multiple of micro_batch_size "
                f"{self.micro_batch_size}: accumulation needs whole micro-batches"
            )
