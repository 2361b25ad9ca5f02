"""The RC-GRPO / GRPO loop: sample tasks, G rollouts each, score, advantages, clipped update.

One step: draw `tasks_per_step` distinct training tasks; give each of its G rollouts a reward
token (RC-GRPO: one sampled per rollout by core_algos.sample_reward_tokens; GRPO: none); roll out
through the engine (which returns the sampled ids, the sampled-token mask and sampling log-probs:
we train on exactly those ids, never a re-rendered chat); score with the paper's R (or BFCL's
check); group advantages; pi_old and the reference log-probs once, with no grad; then
`inner_epochs` passes of the PPO-clipped loss with k3 KL to the frozen initial model, each pass
split into mini-batches of `mini_batch_size` rollouts, one optimizer step each (verl's
ppo_mini_batch_size; from the second update on, ratio != 1 and the clip acts); then
`engine.sync(policy)` so the next rollouts come from the new weights.

Every random draw of step s comes from generators seeded by (seed, s), and checkpoints hold the
weights, optimizer, scheduler and RNG states, so `resume` reproduces on the CPU the metrics of a
run that was never stopped (all but the wall-clock perf/* ones). Metric names: docs/metrics.md.
The paper's comparisons are one field away: `init` sft|rctp, `conditioning` none|rc,
`advantage` grpo|mean|sign.

    rcgrpo train rl --set init=rctp --set conditioning=rc        # RCTP-FT + RC-GRPO
    rcgrpo train rl --set init=sft --set conditioning=none --resume
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from rcgrpo import checkpoint, distributed
from rcgrpo.forward import masked_logits, scatter
from rcgrpo.grpo.core_algos import (
    group_advantages,
    group_reward_stats,
    minibatch_indices,
    policy_loss,
    sample_reward_tokens,
    token_entropy,
    token_logprobs,
)
from rcgrpo.trajectories.record import HIGH, LOW

LogMetrics = Callable[[dict, int], None]


@dataclass(frozen=True)
class RLConfig:
    init: Literal["sft", "rctp"] = "rctp"  # start from the SFT or the RCTP-FT model
    init_path: str = ""  # the model to start from; "" = outputs/<init>/final
    conditioning: Literal["none", "rc"] = "rc"  # rc: a sampled reward token per rollout
    advantage: Literal["grpo", "mean", "sign"] = "grpo"  # (R-mean)/std, R-mean, or 2R-1
    token_sampling: Literal["iid", "stratified"] = "iid"  # iid P(high)=p, or both per group
    p_high: float = 0.5  # P(<|high_reward|>) per rollout (paper: 0.5)
    group_size: int = 5  # rollouts per task, G (paper: 5)
    tasks_per_step: int = 8  # groups per step; the batch is tasks_per_step * group_size rollouts
    steps: int = 400  # RL steps, one rollout batch each (paper: "400 epochs")
    inner_epochs: int = 1  # PPO passes over one step's rollouts (each pass: all mini-batches)
    mini_batch_size: int = 0  # rollouts per optimizer step; 0 = the whole batch (1 update/pass)
    micro_batch_size: int = 8  # rollouts per forward pass (gradient accumulation)
    lr: float = 1e-6  # AdamW learning rate (paper: 1e-6), constant after warmup
    warmup_steps: int = 0  # linear warmup, in RL steps (the lr changes once per RL step)
    grad_clip: float = 1.0  # max global grad norm (0 = off)
    clip_eps: float = 0.2  # PPO ratio clip (paper: 0.2)
    kl_coef: float = 0.1  # beta of the KL to the frozen initial model (paper: 0.1)
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # per-token KL estimator
    aggregation: Literal["token-mean", "seq-mean"] = "token-mean"  # loss average
    reward: Literal["paper", "bfcl"] = "paper"  # which checker's 0/1 is the training reward
    protocol: Literal["bfcl", "combined"] = "combined"  # combined = the paper's Step 1..n prompt
    tasks_from: str = "data/rctp/train.jsonl"  # RL tasks: those of this dataset file ("" = all 720)
    save_every: int = 50  # checkpoint every N steps (0 = never)
    seed: int = 0  # task draws, reward tokens, rollout sampling
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


def batch_tensors(rollouts, pad_id: int = 0):
    """Rollouts -> ids (B, T), loss mask (B, T), sampling logprobs (B, T), attention (B, T)."""
    T = max(len(r.ids) for r in rollouts)
    B = len(rollouts)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask, logp, attn = torch.zeros(B, T), torch.zeros(B, T), torch.zeros(B, T, dtype=torch.long)
    for i, r in enumerate(rollouts):
        n = len(r.ids)
        ids[i, :n] = torch.as_tensor(r.ids)
        mask[i, :n] = torch.as_tensor(r.loss_mask, dtype=torch.float32)
        logp[i, :n] = torch.as_tensor(r.logprobs, dtype=torch.float32)
        attn[i, :n] = 1
    return ids, mask, logp, attn


class Trainer:
    """RC-GRPO / GRPO on a policy (`.model`, `.tokenizer`) through a rollout engine.

    score_fn(task, rollout) -> (paper 0/1, bfcl 0/1); default: the rollout's own rewards if it
    carries them, else rcgrpo.bfcl.checkers.score on its calls. ref_model: the frozen reference
    (default: the model as given, i.e. the initial SFT / RCTP-FT policy). With LoRA that is a
    frozen second adapter, a copy of the starting one (models.add_reference_adapter): not
    `disable_adapter()`, which would be the base before fine-tuning. A full fine-tune has no
    base to share: its reference is a frozen deep copy of the whole model (unavoidable).
    Log-probs, entropy and logprob_gap use the LM head at sampled positions only (N, V), never
    (B, T, V): rcgrpo.forward.masked_logits; bench/memory.py measures the difference.
    temperature: the engine's sampling temperature (rollout.temperature); training log-probs
    use logits / temperature, the distribution the rollouts were drawn from.
    """

    def __init__(
        self,
        policy,
        engine,
        tasks,
        cfg: RLConfig,
        log_metrics: LogMetrics | None = None,
        score_fn=None,
        ref_model=None,
        temperature: float = 1.0,
    ):
        self.policy, self.engine, self.tasks, self.cfg = policy, engine, list(tasks), cfg
        self.model = policy.model
        self.log_metrics = log_metrics
        self.score_fn = score_fn or self._score
        self.ref_model = ref_model
        if temperature <= 0:
            raise ValueError("RL needs sampling: rollout.temperature must be > 0 (0 is greedy)")
        self.temperature = temperature
        self.ref_adapter = None  # a LoRA policy's reference: a frozen adapter inside it
        if ref_model is None and cfg.kl_coef > 0:
            if hasattr(self.model, "peft_config"):
                from rcgrpo.models import add_reference_adapter

                self.ref_adapter = add_reference_adapter(self.model)
            else:
                self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=0.0)
        warm = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )
        # under `accelerate launch`: rank 0 rolls out, ranks share updates (else one does all)
        self.ranks = distributed.for_training(self.model, self.optimizer, self.params)
        tok = getattr(policy, "tokenizer", None)
        self.pad_id = getattr(tok, "pad_token_id", None) or 0
        self.step = 0
        self.out = Path(cfg.out_dir)

    # -- one step ---------------------------------------------------------------------------------
    def _score(self, task, rollout) -> tuple[int, int]:
        record = getattr(rollout, "trajectory", None)  # agent_loop.Rollout: already scored
        if record is not None:
            return int(record.paper_reward), int(record.bfcl_reward)
        from rcgrpo.bfcl.checkers import score

        paper, bfcl = score(task, rollout.calls, self.cfg.protocol)
        return paper.reward, bfcl.reward

    def draw(self, step: int):
        """Tasks (n,) and the token of each of the n*G rollouts, from the step's generator."""
        cfg = self.cfg
        g = torch.Generator().manual_seed(step_seed(cfg.seed, step))
        n = min(cfg.tasks_per_step, len(self.tasks))
        picked = torch.randperm(len(self.tasks), generator=g)[:n].tolist()
        tasks = [self.tasks[i] for i in picked]
        if cfg.conditioning == "rc":
            high = sample_reward_tokens(n, cfg.group_size, cfg.p_high, cfg.token_sampling, g)
            tokens = [HIGH if h else LOW for h in high.flatten().tolist()]  # (n*G,) group-major
        else:
            tokens = [None] * (n * cfg.group_size)
        return tasks, tokens

    def _logprobs(self, model, ids, attn, mask):
        """Log-probs of ids[:, 1:] at the sampling temperature, (B, T-1) with 0 where mask
        (B, T-1) is 0; the raw logits (N, V) at the N sampled positions (temperature 1, what the
        engine reports its log-probs at) and those positions, where (B, T-1)."""
        logits, where = masked_logits(model, ids, attn, mask)
        logits = logits.float()
        scaled = logits if self.temperature == 1.0 else logits / self.temperature
        return scatter(token_logprobs(scaled, ids[:, 1:][where]), where), logits, where

    def _ref_logprobs(self, ids, attn, mask):
        """The reference's log-probs (B, T-1), like _logprobs; call under no_grad."""
        if self.ref_adapter is None:
            return self._logprobs(self.ref_model, ids, attn, mask)[0]
        from rcgrpo.models import using_adapter

        with using_adapter(self.model, self.ref_adapter):
            return self._logprobs(self.model, ids, attn, mask)[0]

    def train_step(self, step: int) -> dict:
        cfg, t0 = self.cfg, time.perf_counter()
        tasks, tokens = self.draw(step)
        G = cfg.group_size
        flat_tasks = [t for t in tasks for _ in range(G)]  # group-major, matches tokens
        rollouts = None
        if self.ranks.rank == 0:
            rollouts = self.engine.rollout(
                flat_tasks, tokens, cfg.protocol, step_seed(cfg.seed, step)
            )
        rollouts = self.ranks.broadcast(rollouts)  # the 1-process batch, sampled once
        t_roll = time.perf_counter() - t0
        scores = [self.score_fn(t, r) for t, r in zip(flat_tasks, rollouts, strict=True)]
        col = 0 if cfg.reward == "paper" else 1
        rewards = torch.tensor([s[col] for s in scores], dtype=torch.float32).view(-1, G)
        adv = group_advantages(rewards, cfg.advantage).flatten()  # (B,)

        ids, mask, sampled_logp, attn = batch_tensors(rollouts, self.pad_id)
        mask, sampled_logp = mask[:, 1:], sampled_logp[:, 1:]  # align with predicted tokens
        # PPO schedule; the shuffle has a generator of its own (seeded by the step, not by
        # draw's stream) so that a resumed run visits the rollouts in the same order.
        shuffle = torch.Generator().manual_seed(2**32 + step_seed(cfg.seed, step))
        passes = minibatch_indices(
            len(rollouts), cfg.mini_batch_size, cfg.micro_batch_size, cfg.inner_epochs, shuffle
        )
        # pi_old, ONCE per batch before any update, with the weights the engine sampled from (in
        # eval mode, as the engine samples); not the engine's log-probs, which are at T = 1 where
        # ours are at the sampling temperature. Same micro-batches as the first update, so its
        # forwards are bit-identical (ratio exactly 1). The reference and logprob_gap ride along.
        old = torch.zeros_like(mask)  # (B, T-1)
        use_ref = (self.ref_model is not None or self.ref_adapter is not None) and cfg.kl_coef > 0
        ref = torch.zeros_like(mask) if use_ref else None
        gap = torch.zeros(())  # sum over sampled tokens of |engine log p - trainer log p|
        self.model.eval()
        with torch.no_grad():
            for c in (c for mini in passes[0] for c in mini):
                old[c], logits, where = self._logprobs(self.model, ids[c], attn[c], mask[c])
                mine = old[c]
                if self.temperature != 1.0:
                    mine = scatter(token_logprobs(logits, ids[c, 1:][where]), where)
                gap += ((sampled_logp[c] - mine).abs() * mask[c]).sum()
                if ref is not None:
                    ref[c] = self._ref_logprobs(ids[c], attn[c], mask[c])

        def size(c):  # what a micro-batch weighs in its mini-batch's mean: tokens or sequences
            return mask[c].sum() if cfg.aggregation == "token-mean" else (mask[c].sum(1) > 0).sum()

        self.model.train()
        lr = self.scheduler.get_last_lr()[0]  # one lr per RL step: warmup counts RL steps
        self.updates: list[dict[str, float]] = []  # per optimizer step, for inspection
        for mini in (mini for one_pass in passes for mini in one_pass):
            self.optimizer.zero_grad(set_to_none=True)
            total = sum(size(c) for c in mini).clamp(min=1)
            upd: dict[str, float] = {}
            # (micro-batch, 1.0); under accelerate this rank's share, + zero-weight padding
            mine = self.ranks.share(mini)
            for i, (c, share) in enumerate(mine):
                # under accelerate: through the DDP/FSDP wrapper, all-reduced on the last one
                with self.ranks.syncing(i, len(mine)):
                    args = (ids[c], attn[c], mask[c])
                    logp, logits, where = self.ranks.forward(self._logprobs, *args)
                    loss, stats = policy_loss(
                        logp,
                        old[c],
                        adv[c],
                        mask[c],
                        None if ref is None else ref[c],
                        clip_eps=cfg.clip_eps,
                        kl_coef=cfg.kl_coef,
                        kl_estimator=cfg.kl_estimator,
                        aggregation=cfg.aggregation,
                        entropy=scatter(token_entropy(logits.detach()), where),
                    )
                    # token (or sequence) share within the GLOBAL mini-batch
                    w = size(c) / total * share
                    self.ranks.backward(loss * w)
                stats["total"] = loss.item()
                for k, v in stats.items():
                    upd[k] = upd.get(k, 0.0) + float(w) * v
            max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
            # the mini-batch's stats: sums over the ranks' shares
            upd = dict(zip(upd, self.ranks.sum(list(upd.values())), strict=True))
            upd["grad_norm"] = float(self.ranks.clip(max_norm))
            self.optimizer.step()
            self.updates.append(upd)
        self.scheduler.step()
        self.model.eval()
        self.engine.sync(self.policy)
        acc = {k: sum(u[k] for u in self.updates) / len(self.updates) for k in self.updates[0]}

        gen_tokens = float(mask.sum())
        metrics = {
            "reward/mean": float(rewards.mean()),
            "reward/other_checker_mean": float(
                torch.tensor([s[1 - col] for s in scores]).float().mean()
            ),
            **{f"rollout/{k}": v for k, v in group_reward_stats(rewards).items()},
            "rollout/adv_std": float(adv.std(unbiased=False)),
            "rollout/adv_abs_mean": float(adv.abs().mean()),
            "rollout/zero_adv_frac": float((adv == 0).float().mean()),
            "rollout/response_tokens": gen_tokens / len(rollouts),
            "rollout/logprob_gap": float(gap / mask.sum().clamp(min=1)),
            "loss/total": acc["total"],
            "loss/pg": acc["pg_loss"],
            "loss/kl": acc["kl"],
            "loss/clip_frac": acc["clip_frac"],
            "loss/ratio_mean": acc["ratio_mean"],
            "loss/clip_frac_last": self.updates[-1]["clip_frac"],  # the most off-policy update
            "loss/ratio_mean_last": self.updates[-1]["ratio_mean"],
            "loss/optimizer_steps": len(self.updates),
            "loss/entropy": acc["entropy"],
            "loss/grad_norm": acc["grad_norm"],
            "loss/lr": lr,
            "perf/gen_tokens_per_s": gen_tokens / max(t_roll, 1e-9),
            "perf/rollout_s": t_roll,
            "perf/step_s": time.perf_counter() - t0,
        }
        if cfg.conditioning == "rc":  # per-token means only for tokens drawn this step
            is_high = torch.tensor([t == HIGH for t in tokens]).view(-1, G)
            for name, sel in (("high", is_high), ("low", ~is_high)):
                if sel.any():
                    metrics[f"reward/mean_{name}"] = float(rewards[sel].mean())
            if is_high.any() and (~is_high).any():
                metrics["reward/token_gap"] = (
                    metrics["reward/mean_high"] - metrics["reward/mean_low"]
                )
        return metrics

    # -- the loop ---------------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        return checkpoint.save(
            checkpoint.path_for(self.out, step), self.model, self.optimizer, self.scheduler, step
        )

    def resume(self) -> int:
        """Load the latest checkpoint under out_dir (if any) and return its step."""
        ckpt = checkpoint.latest(self.out)
        if ckpt is None:
            return 0
        self.step = checkpoint.load(ckpt, self.model, self.optimizer, self.scheduler)["step"]
        self.engine.sync(self.policy)
        return self.step

    def _trim_metrics(self) -> None:
        """metrics.jsonl keeps steps 1..self.step only: after a resume the steps past the
        checkpoint are recomputed identically; a fresh run (step 0) starts an empty file
        instead of appending to an earlier run's (write_summary averages the whole file)."""
        path = self.out / "metrics.jsonl"
        if path.exists() and distributed.is_main():
            kept = [
                ln for ln in path.read_text().splitlines() if json.loads(ln)["step"] <= self.step
            ]
            path.write_text("".join(ln + "\n" for ln in kept))

    def train(self, resume: bool = False, stop_after: int | None = None) -> list[dict]:
        """Run to cfg.steps (or stop after step `stop_after`, for tests); returns new metrics."""
        self.out.mkdir(parents=True, exist_ok=True)
        if resume:
            self.resume()
        self._trim_metrics()
        history = []
        last = self.cfg.steps if stop_after is None else min(stop_after, self.cfg.steps)
        for step in range(self.step + 1, last + 1):
            metrics = self.train_step(step)
            self.step = step
            history.append(metrics)
            if not distributed.is_main():  # under accelerate rank 0 writes and logs
                continue
            with (self.out / "metrics.jsonl").open("a") as fh:
                fh.write(json.dumps({"step": step, **metrics}) + "\n")
            if self.log_metrics is not None:
                self.log_metrics(metrics, step)
            if self.cfg.save_every and step % self.cfg.save_every == 0:
                self.save(step)
        return history
