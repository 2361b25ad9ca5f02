"""The `rl:` config of RC-GRPO / GRPO (one field per setting, its help beside it) and the per-step
seed every random draw of a step comes from.

The paper's comparisons are one field away: `init` sft|rctp, `conditioning` none|rc,
`advantage` grpo|mean|sign|max_norm.

    rcgrpo stage rl --set init=rctp --set conditioning=rc        # RCTP-FT + RC-GRPO
"""

from __future__ import annotations

from typing import Literal

from rcgrpo.fields import config_class, ranged, setting


@config_class
class RLConfig:
    """params.yaml `rl:` section."""

    init: Literal["sft", "rctp"] = setting("rctp", "start from the SFT or the RCTP-FT model")
    init_path: str = setting("", 'the model to start from; "" = outputs/<init>/final')
    conditioning: Literal["none", "rc"] = setting("rc", "rc: a sampled reward token per rollout")
    advantage: Literal["grpo", "mean", "sign", "max_norm"] = setting(
        "grpo", "(R-mean)/std, R-mean, 2R-1, or (R-mean)/max|R-mean|"
    )
    token_sampling: Literal["iid", "stratified"] = setting(
        "iid", "reward tokens: iid with P(high) = p_high, or both in every group"
    )
    p_high: float = ranged(0.5, "[0, 1]", "P(<|high_reward|>) per rollout (paper: 0.5)")
    group_size: int = ranged(5, "[1, inf)", "rollouts per task, G (paper: 5)")
    tasks_per_step: int = ranged(
        8, "[1, inf)", "groups per step; the batch is tasks_per_step * group_size rollouts"
    )
    steps: int = ranged(400, "[1, inf)", 'RL steps, one rollout batch each (paper: "400 epochs")')
    generated_token_budget: int = ranged(
        0,
        "[0, inf)",
        "stop after the step at which the sampled tokens of every rollout generated (kept or "
        "dropped) reach this; 0 = run all `steps` (arms compared at equal budget)",
    )
    inner_epochs: int = ranged(
        1, "[1, inf)", "PPO passes over one step's rollouts (each pass: all mini-batches)"
    )
    mini_batch_size: int = ranged(
        0, "[0, inf)", "rollouts per optimizer step; 0 = the whole batch (1 update per pass)"
    )
    micro_batch_size: int = ranged(8, "[1, inf)", "rollouts per forward pass (accumulation)")
    max_tokens_per_micro_batch: int = ranged(
        0,
        "[0, inf)",
        "tokens per forward pass, rollouts sorted by length and packed (sized by rcgrpo plan); "
        "0 = by count",
    )
    max_sampled_per_micro_batch: int = ranged(
        0,
        "[0, inf)",
        "with the token budget: sampled (loss) positions per forward pass, the LM head's work "
        "(rcgrpo plan sizes memory for it); 0 = no cap of its own",
    )
    shared_prefix: bool = setting(
        True,
        "the update computes each micro-batch's shared prompt prefixes once (SDPA and "
        "flash-attention models; equal log-probs and gradients)",
    )
    lr: float = ranged(1e-6, "(0, 1]", "AdamW learning rate (paper: 1e-6), constant after warmup")
    lr_lora: float = ranged(
        0.0, "[0, 1]", "AdamW learning rate of a LoRA policy; 0 = lr (paper preset: 10x lr)"
    )
    warmup_steps: int = ranged(0, "[0, inf)", "linear warmup, in RL steps (lr changes per step)")
    grad_clip: float = ranged(1.0, "[0, inf)", "max global grad norm (0 = off)")
    clip_eps: float = ranged(0.2, "(0, 1]", "PPO ratio clip (paper: 0.2)")
    kl_coef: float = ranged(0.1, "[0, inf)", "beta of the KL to the frozen initial model (0.1)")
    kl_estimator: Literal["k1", "k2", "k3"] = setting("k3", "per-token KL estimator")
    aggregation: Literal["token-mean", "seq-mean"] = setting("token-mean", "loss average")
    overlong: Literal["train", "mask", "soft_penalty"] = setting(
        "train",
        "episodes the token budget stopped: train on them, mask them from the loss, or DAPO's "
        "soft length penalty on the reward (rcgrpo.training.grpo.overlong)",
    )
    overlong_cache: int = ranged(
        256, "[1, inf)", "soft_penalty: the last N tokens of the episode budget ramp it 0 -> -1"
    )
    group_filter: Literal["none", "drop_zero_variance", "top_variance"] = setting(
        "none",
        "which groups train: all; not the zero-variance ones (DAPO); the top_variance_keep "
        "share by reward variance (RAGEN-2) (rcgrpo.training.grpo.group_filter)",
    )
    top_variance_keep: float = ranged(0.5, "(0, 1]", "top_variance: the share of groups kept")
    refill: Literal["none", "oversample"] = setting(
        "none", "oversample: draw more groups until tasks_per_step are kept (DAPO)"
    )
    refill_max_rounds: int = ranged(2, "[0, inf)", "oversample: extra rounds of groups at most")
    task_prefilter: Literal["none", "no_signal"] = setting(
        "none",
        "no_signal: before its rollouts, skip a task whose last z groups had zero variance with "
        "probability 1 - prefilter_keep^z (GRESO; rcgrpo.training.grpo.presample)",
    )
    prefilter_keep: float = ranged(0.5, "(0, 1]", "no_signal: a silent task's keep probability")
    rollouts_per_task: int = ranged(
        0,
        "[0, inf)",
        "PODS: roll out this many per task and train the group_size of largest reward variance; "
        "0 = group_size (rcgrpo.training.grpo.presample)",
    )
    behaviour_logprobs: Literal["recompute", "engine"] = setting(
        "recompute",
        "pi_old: a trainer forward before the update, or the engine's sampled-token log-probs "
        "with no forward (needs rollout.temperature 1) (rcgrpo.training.grpo.engine_is)",
    )
    engine_is: Literal["none", "token", "sequence"] = setting(
        "none",
        "engine/trainer gap: no correction; a weight min(pi_trainer / pi_engine, engine_is_cap) "
        "per token; or rollouts whose geometric mean ratio leaves 1 +- engine_is_bound masked",
    )
    engine_is_cap: float = ranged(2.0, "[1, inf)", "token: the weight's cap C (verl, SkyRL: 2)")
    engine_is_bound: float = ranged(
        0.01, "(0, 1)", "sequence: the geometric mean ratio's bound b (SkyRL: 0.99 .. 1.01)"
    )
    sync_gap_max: float = ranged(
        0.1,
        "[0, inf)",
        "after every weight sync the engine and the trainer score a fixed sequence; a mean "
        "|log-prob gap| per token above this fails the step (0 = logged only) "
        "(rcgrpo.training.grpo.sync_probe)",
    )
    reward: str = setting(
        "", 'the check whose value trains ("" = the environment\'s: BFCL paper, calculator correct)'
    )
    protocol: Literal["bfcl", "combined"] = setting(
        "combined", "combined: the paper's Step 1..n prompt; bfcl: turn by turn"
    )
    tasks_from: str = setting(
        "data/rctp/train.jsonl", 'RL tasks: those of this dataset file ("" = every train task)'
    )
    save_every: int = ranged(50, "[0, inf)", "checkpoint every N steps (0 = never)")
    seed: int = ranged(0, "[0, inf)", "task draws, reward tokens, rollout sampling")
    out_dir: str = setting("outputs/rl", "checkpoints/, metrics.jsonl, final/")
    heartbeat_s: float = ranged(
        30.0, "[0, inf)", "launched ranks: seconds between heartbeats (0 = none, no stall watch)"
    )
    stall_s: float = ranged(
        300.0, "(0, inf)", "a rank without progress this long is named and the run fails"
    )

    def __post_init__(self):
        if self.token_sampling == "stratified" and self.group_size < 2:
            raise ValueError("token_sampling=stratified needs group_size >= 2 to hold both tokens")
        if self.advantage != "sign" and self.group_size < 2:
            raise ValueError(
                f"advantage={self.advantage} needs group_size >= 2 (a group of 1 "
                "always has zero variance, so every update would vanish)"
            )
        if self.rollouts_per_task and self.rollouts_per_task < self.group_size:
            raise ValueError(
                f"rollouts_per_task {self.rollouts_per_task} < group_size {self.group_size}: "
                "PODS keeps group_size of the rollouts per task, so it needs at least as many"
            )
        if self.rollouts_per_task and self.overlong == "soft_penalty":
            raise ValueError(
                "rollouts_per_task does not combine with overlong: soft_penalty (the kept "
                "rollouts' advantages are recomputed from the checker's rewards, unpenalised)"
            )
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
