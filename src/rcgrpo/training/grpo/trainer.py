"""The RC-GRPO / GRPO loop: sample tasks, G rollouts each, score, advantages, clipped update.

One step: draw `tasks_per_step` distinct training tasks; give each of its G rollouts a reward
token (RC-GRPO: one sampled per rollout by core_algos.sample_reward_tokens; GRPO: none); roll out
through the engine (which returns the sampled ids, the sampled-token mask and sampling log-probs:
we train on exactly those ids, never a re-rendered chat); score with the paper's R (or BFCL's
check); group advantages; pi_old (or the engine's log-probs: rl.behaviour_logprobs) and the
reference log-probs once, with no grad; then `inner_epochs` passes of the PPO-clipped loss with
k3 KL to the frozen initial model, each pass split into mini-batches of `mini_batch_size`
rollouts, one optimizer step each (verl's ppo_mini_batch_size; from the second update on,
ratio != 1 and the clip acts); then `engine.sync(policy)` so the next rollouts come from the
new weights, and a probe checks that the engine serves them (sync_probe.py).

Every random draw of step s comes from generators seeded by (seed, s), and checkpoints hold the
weights, optimizer, scheduler and RNG states, so `resume` reproduces on the CPU the metrics of a
run that was never stopped (all but the wall-clock perf/* ones). Metric names: docs/metrics.md.
The paper's comparisons are one field away: `init` sft|rctp, `conditioning` none|rc,
`advantage` grpo|mean|sign|max_norm.

The step's parts live beside this loop: config.py (RLConfig), rollouts.py (draw, roll out, score,
advantages), update.py (pi_old, reference, PPO mini-batches), metrics.py (the step's metrics).

    rcgrpo stage rl --set init=rctp --set conditioning=rc        # RCTP-FT + RC-GRPO
    rcgrpo stage rl --set init=sft --set conditioning=none --resume
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rcgrpo.training import balance, checkpoint, distributed, shared_forward, shared_prefix
from rcgrpo.training.forward import packs
from rcgrpo.training.grpo import dealing, engine_is, group_filter, presample, rollouts, update
from rcgrpo.training.grpo.config import RLConfig
from rcgrpo.training.grpo.metrics import step_metrics, trim_jsonl
from rcgrpo.training.grpo.sync_probe import SyncProbe
from rcgrpo.training.heartbeat import for_rank
from rcgrpo.training.optim import adamw

LogMetrics = Callable[[dict, int], None]


class Trainer:
    """RC-GRPO / GRPO on a policy (`.model`, `.tokenizer`) through a rollout engine.

    score_fn(task, rollout) -> Rewards: the run environment's scorer (rcgrpo.rollout.environment
    .Scorer: `env.scorer(cfg.protocol, cfg.reward or None)`), whose `reward` names the check
    that trains (cfg.reward "" = the environment's choice). ref_model: the frozen reference
    (default: the model as given, i.e. the initial SFT / RCTP-FT policy). With LoRA that is a
    frozen second adapter, a copy of the starting one (models.add_reference_adapter): not
    `disable_adapter()`, which would be the base before fine-tuning. A full fine-tune has no
    base to share: its reference is a frozen deep copy of the whole model (unavoidable).
    Log-probs, entropy and logprob_gap use the LM head at sampled positions only (N, V), never
    (B, T, V): rcgrpo.training.forward.masked_logits; bench/memory.py measures the difference.
    temperature: the engine's sampling temperature (rollout.temperature); training log-probs
    use logits / temperature, the distribution the rollouts were drawn from.
    on_rollouts(step, StepRollouts): called on the main process right after a step's rollouts
    are sampled and scored, with exactly what the update trains on (the pipeline writes
    episode traces with it: rcgrpo.tracking.traces.rl_hook).
    """

    def __init__(
        self,
        policy,
        engine,
        tasks,
        cfg: RLConfig,
        score_fn,
        log_metrics: LogMetrics | None = None,
        ref_model=None,
        temperature: float = 1.0,
        on_rollouts: Callable[[int, rollouts.StepRollouts], None] | None = None,
    ):
        self.on_rollouts = on_rollouts
        # the check that trains as the scorer resolved it: reward/other_checker_mean reads it
        cfg = dataclasses.replace(cfg, reward=getattr(score_fn, "reward", cfg.reward))
        self.policy, self.engine, self.tasks, self.cfg = policy, engine, list(tasks), cfg
        self.model = policy.model
        self.shared = shared_forward.enable(self.model, cfg.shared_prefix)  # not eager
        self.attn_coef = balance.model_coef(self.model)  # attention's weight in shared clusters
        self.log_metrics = log_metrics
        self.score_fn = score_fn
        self.ref_model = ref_model
        if temperature <= 0:
            raise ValueError("RL needs sampling: rollout.temperature must be > 0 (0 is greedy)")
        engine_is.check(cfg, temperature, engine)  # the engine serves its log-probs
        self.temperature = temperature
        self.ref_adapter = None  # a LoRA policy's reference: a frozen adapter inside it
        if ref_model is None and cfg.kl_coef > 0:
            if hasattr(self.model, "peft_config"):
                from rcgrpo.models.lora import add_reference_adapter

                self.ref_adapter = add_reference_adapter(self.model)
            else:
                self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.params, self.optimizer = adamw(self.model, cfg)
        warm = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )
        # under `accelerate launch` / torchrun: ranks share rollouts, pi_old/ref and updates
        # (else one does all); collectives wait up to one rank's rollout (from its budget)
        self.ranks = distributed.for_training(
            self.model, self.optimizer, self.params, self._timeout_s()
        )
        self.heartbeat = for_rank(self.cfg, self.ranks, self.engine, self.model)
        # every engine of the project scores (Engine.score); a test's stand-in may not
        has_score = hasattr(engine, "score")
        self.probe = SyncProbe(policy, self.model, cfg.sync_gap_max) if has_score else None
        self.rolled_out: list[int] = []  # rollouts this rank sampled, per step
        tok = getattr(policy, "tokenizer", None)
        self.pad_id = getattr(tok, "pad_token_id", None) or 0
        self.step = 0
        self.generated_tokens = 0  # every rollout's sampled tokens so far (budget)
        self.draws = presample.Draws(self.tasks, cfg)  # the rounds' tasks; the prefilter's state
        self.run: dict = {}  # run_identity.begin: {run_id, config_hash}
        self.out = Path(cfg.out_dir)

    def _timeout_s(self) -> float:
        """The process-group timeout: one rank's rollout at the configured engine's concurrency
        and budget (an engine without `cfg.limits`, e.g. a test's, gets the floor)."""
        limits = getattr(getattr(self.engine, "cfg", None), "limits", None)
        if limits is None:
            return distributed.MIN_TIMEOUT_S
        world = int(os.environ.get("WORLD_SIZE", "1"))
        episodes = -(-self.cfg.tasks_per_step // world) * self.cfg.group_size
        profile = getattr(getattr(self.policy, "config", None), "profile", "")  # its shape
        concurrent, rate = distributed.rollout_pace(self.engine.cfg, profile, self.model)
        return distributed.collective_timeout_s(episodes, concurrent, limits.max_total_tokens, rate)

    def _phase(self, name: str, step: int) -> None:
        if self.heartbeat is not None:
            self.heartbeat.phase(name, step)

    # -- one step ---------------------------------------------------------------------------------
    def draw(self, step: int):
        """Tasks (n,) and the token of each of the n*G rollouts, from the step's generator."""
        return rollouts.draw(self.tasks, self.cfg, step)

    def _logprobs(self, model, ids, attn, mask):
        """Log-probs (B, T-1), head.Sampled (entropy, T = 1 log-probs) and positions at this
        run's temperature (update.logprobs)."""
        return update.logprobs(model, ids, attn, mask, self.temperature)

    def _ref_logprobs(self, ids, attn, mask):
        """The reference's log-probs (B, T-1), like _logprobs; call under no_grad."""
        if self.ref_adapter is None:
            return self._logprobs(self.ref_model, ids, attn, mask)[0]
        from rcgrpo.models.lora import using_adapter

        with using_adapter(self.model, self.ref_adapter):
            return self._logprobs(self.model, ids, attn, mask)[0]

    def _round(self, step: int, seed: int):
        """The step's groups drawn and rolled out at run seed `seed` (`cfg.seed`: the step's own
        draw; others: group_filter's refill rounds), handed to on_rollouts."""
        cfg = self.cfg if seed == self.cfg.seed else dataclasses.replace(self.cfg, seed=seed)
        tasks, tokens = self.draws.draw(cfg, step, first=seed == self.cfg.seed)
        out = rollouts.roll_out(self.engine, self.ranks, tasks, tokens, cfg, step, self.score_fn)
        self.draws.seen(out)
        if self.on_rollouts is not None and distributed.is_main():
            self.on_rollouts(step, out)
        return out

    def train_step(self, step: int) -> dict:
        cfg, t0 = self.cfg, time.perf_counter()
        self._phase("rollout", step)
        out, filtered = group_filter.collect(lambda seed: self._round(step, seed), cfg)
        if not out.tasks:  # every group dropped, none refilled: no update this step
            return {
                **filtered,
                "loss/optimizer_steps": 0.0,
                "perf/step_s": time.perf_counter() - t0,
            }
        out.records = []  # the whole rollouts (token lists, messages) not kept through the update
        batch = update.to_batch(out.rollouts, self.pad_id)
        lengths = [len(r.ids) for r in out.rollouts]
        packed = packs(self.model)  # flash-attention: micro-batches are padding-free rows
        passes = update.schedule(cfg, out.rollouts, step, packed, self.shared, self.attn_coef)
        use_ref = (self.ref_model is not None or self.ref_adapter is not None) and cfg.kl_coef > 0
        # pi_old and the reference sharded like the update (dealing.first_pass_share), then
        # summed over the ranks (later passes reshuffle the micro-batches between ranks)
        mine = dealing.first_pass_share(self.ranks, self.model, batch, passes)
        anchors = dealing.anchor_share(cfg, self.ranks, self.model, batch, passes)  # pi_old
        ref_fn = self._ref_logprobs if use_ref else None
        self._phase("update", step)
        old, ref, gap = update.behaviour_logprobs(
            self.model, batch, mine, self._logprobs, self.temperature, ref_fn, anchors
        )
        first = None  # engine: the trainer's pre-step log p, completed by the first pass
        if cfg.behaviour_logprobs == "engine":
            first, old = old, None  # this rank's rows: ppo_updates sums them over the ranks
        old, ref, gap = self.ranks.merge(old, ref, gap)
        self.rolled_out.append(out.own)
        lr = self.scheduler.get_last_lr()[0]  # one lr per RL step: warmup counts RL steps
        self.updates = update.ppo_updates(  # per optimizer step, for inspection
            self.model,
            self.optimizer,
            self.ranks,
            batch,
            old,
            ref,
            out.advantages,
            passes,
            cfg,
            self._logprobs,
            first,
        )
        self.scheduler.step()
        self._phase("sync", step)
        self.engine.sync(self.policy)
        synced = self.probe(self.engine, step) if self.probe is not None else {}  # sync/*
        gap, corrected = update.engine_gap(cfg, batch, old, first, gap, passes)  # + engine_is
        metrics = step_metrics(
            cfg, out, batch.mask, gap, self.updates, lr, time.perf_counter() - t0
        )
        metrics |= corrected | synced
        fwd = shared_prefix.forward_metrics(
            batch.ids, lengths, passes, packed, self.shared, self.attn_coef
        )
        # + pad_frac, micro-batches, computed tokens (shared or not); with a filter, reward/* are
        # the first draw's and the kept groups' are <name>_kept
        return metrics | fwd | group_filter.first_draw(metrics, filtered)

    # -- the loop ---------------------------------------------------------------------------------
    def save(self, step: int) -> Path:
        return checkpoint.save(
            checkpoint.path_for(self.out, step),
            self.model,
            self.optimizer,
            self.scheduler,
            step,
            extra={"generated_tokens": self.generated_tokens, **self.draws.state()},
            run=self.run,
        )

    def resume(self, resume: bool | str = True) -> int:
        """Begin this run (run_identity.begin: a fresh one, or the checked latest checkpoint of
        the same run, or the one `resume` names); load that checkpoint and return its step."""
        from rcgrpo.training.run_identity import begin

        main = distributed.is_main()
        ckpt, self.run = begin(self.out, dataclasses.asdict(self.cfg), resume, main)
        if ckpt is None:
            return 0
        state = checkpoint.load(ckpt, self.model, self.optimizer, self.scheduler)
        self.step = state["step"]
        self.generated_tokens = int((state["extra"] or {}).get("generated_tokens", 0))
        self.draws.restore(state["extra"] or {})
        self.engine.sync(self.policy)
        return self.step

    def train(self, resume: bool | str = False, stop_after: int | None = None) -> list[dict]:
        """Run to cfg.steps (or stop after step `stop_after`, for tests); returns new metrics."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.resume(resume)
        if self.probe is not None:  # the engine serves the starting (or resumed) policy
            self.probe(self.engine, self.step)
        if distributed.is_main():
            trim_jsonl(self.out / "metrics.jsonl", self.step)
        history = []
        last = self.cfg.steps if stop_after is None else min(stop_after, self.cfg.steps)
        budget = self.cfg.generated_token_budget
        for step in range(self.step + 1, last + 1):
            if budget and self.generated_tokens >= budget:
                break  # the budget is spent: every arm of a comparison stops at the same one
            metrics = self.train_step(step)
            self.step = step
            self.generated_tokens += int(metrics["rollout/generated_tokens"])
            metrics["rollout/generated_tokens_total"] = float(self.generated_tokens)
            history.append(metrics)
            if not distributed.is_main():  # under accelerate rank 0 writes and logs
                continue
            with (self.out / "metrics.jsonl").open("a") as fh:
                fh.write(json.dumps({"step": step, **metrics}) + "\n")
            if self.log_metrics is not None:
                self.log_metrics(metrics, step)
            if self.cfg.save_every and step % self.cfg.save_every == 0:
                self._phase("save", step)
                self.save(step)
        if self.heartbeat is not None:
            self.heartbeat.close()
        return history
