"""The `rl:` config of RC-GRPO / GRPO (one field per setting, its help beside it) and the per-step
seed every random draw of a step comes from.

The paper's comparisons are one field away: `init` sft|rctp, `conditioning` none|rc,
`advantage` grpo|mean|max_norm|sign.

    rcgrpo train rl --set init=rctp --set conditioning=rc        # RCTP-FT + RC-GRPO
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rcgrpo.config import ranged


@dataclass(frozen=True)
class RLConfig:
    init: Literal["sft", "rctp"] = "rctp"  # start from the SFT or the RCTP-FT model
    init_path: str = ""  # the model to start from; "" = outputs/<init>/final
    conditioning: Literal["none", "rc"] = "rc"  # rc: a sampled reward token per rollout
    advantage: Literal["grpo", "mean", "max_norm", "sign"] = "grpo"  # see group_advantages
    token_sampling: Literal["iid", "stratified"] = "iid"  # iid P(high)=p, or both per group
    p_high: float = ranged(0.5, "[0, 1]")  # P(<|high_reward|>) per rollout (paper: 0.5)
    group_size: int = ranged(5, "[1, inf)")  # rollouts per task, G (paper: 5)
    # groups per step; the batch is tasks_per_step * group_size rollouts
    tasks_per_step: int = ranged(8, "[1, inf)")
    steps: int = ranged(400, "[1, inf)")  # RL steps, one rollout batch each (paper: "400 epochs")
    # PPO passes over one step's rollouts (each pass: all mini-batches)
    inner_epochs: int = ranged(1, "[1, inf)")
    # rollouts per optimizer step; 0 = the whole batch (1 update/pass)
    mini_batch_size: int = ranged(0, "[0, inf)")
    # rollouts per forward pass (gradient accumulation)
    micro_batch_size: int = ranged(8, "[1, inf)")
    # tokens per forward pass: rollouts sorted by length and packed up to this many computed
    # tokens (padded, or packed under flash-attention); 0 = micro_batch_size rollouts instead
    # (rcgrpo.training.batching; `rcgrpo plan` gives the largest that fits a GPU)
    max_tokens_per_micro_batch: int = ranged(0, "[0, inf)")  # 0 = by count, micro_batch_size
    lr: float = ranged(1e-6, "(0, 1]")  # AdamW learning rate (paper: 1e-6), constant after warmup
    # linear warmup, in RL steps (the lr changes once per RL step)
    warmup_steps: int = ranged(0, "[0, inf)")
    grad_clip: float = ranged(1.0, "[0, inf)")  # max global grad norm (0 = off)
    clip_eps: float = ranged(0.2, "(0, 1]")  # PPO ratio clip (paper: 0.2)
    # beta of the KL to the frozen initial model (paper: 0.1)
    kl_coef: float = ranged(0.1, "[0, inf)")
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # per-token KL estimator
    aggregation: Literal["token-mean", "seq-mean"] = "token-mean"  # loss average
    # episodes stopped by the token budget: train on them, mask them from the loss, or DAPO's
    # soft length penalty on the reward (rcgrpo.training.grpo.overlong)
    overlong: Literal["train", "mask", "soft_penalty"] = "train"
    # soft_penalty: the last this-many tokens of rollout.max_total_tokens ramp the penalty 0 -> -1
    overlong_cache: int = ranged(256, "[1, inf)")
    reward: Literal["paper", "bfcl"] = "paper"  # which checker's 0/1 is the training reward
    protocol: Literal["bfcl", "combined"] = "combined"  # combined = the paper's Step 1..n prompt
    tasks_from: str = "data/rctp/train.jsonl"  # RL tasks: those of this dataset file ("" = all 720)
    save_every: int = ranged(50, "[0, inf)")  # checkpoint every N steps (0 = never)
    seed: int = ranged(0, "[0, inf)")  # task draws, reward tokens, rollout sampling
    out_dir: str = "outputs/rl"  # checkpoints/, metrics.jsonl, final/

    def __post_init__(self):
        if self.token_sampling == "stratified" and self.group_size < 2:
            raise ValueError("token_sampling=stratified needs group_size >= 2 to hold both tokens")
        if self.advantage != "sign" and self.group_size < 2:
            raise ValueError(
                f"advantage={self.advantage} needs group_size >= 2 (a group of 1 "
                "always has zero variance, so every update would vanish)"
            )
        if self.inner_epochs < 1 or self.steps < 1 or self.tasks_per_step < 1:
            raise ValueError("steps, tasks_per_step and inner_epochs must be >= 1")
        if self.micro_batch_size < 1 or self.mini_batch_size < 0:
            raise ValueError("micro_batch_size must be >= 1 and mini_batch_size >= 0 (0 = batch)")
        batch = self.tasks_per_step * self.group_size
        if self.mini_batch_size and self.mini_batch_size % self.micro_batch_size:
            raise ValueError(
                f"mini_batch_size {self.mini_batch_size} must be a multiple of micro_batch_size "
                f"{self.micro_batch_size} (or 0): each update accumulates whole micro-batches"
            )
        if self.mini_batch_size and batch % self.mini_batch_size:
            raise ValueError(
                f"mini_batch_size {self.mini_batch_size} must divide the batch tasks_per_step * "
                f"group_size = {batch}: a smaller last mini-batch would be a noisier update that "
                "weighs as much as a full one"
            )

    @property
    def start_path(self) -> str:
        return self.init_path or f"outputs/{self.init}/final"


def step_seed(seed: int, step: int) -> int:
    """One integer per (run seed, step): every draw of a step depends on nothing else."""
    return seed * 1_000_003 + step
