"""The two sides of bench/peer_trl.py: rcgrpo's Trainer and TRL's GRPOTrainer, each run from the
same start and timed the same way (a `Clock` wrapped around each side's own methods), one row of
figures per RL step.

Phases, per RL step: rollout = sampling + tools + scoring (rcgrpo: `Engine.rollout`; TRL:
`_generate`, its lock-step tool loop included, + `_calculate_rewards`); generation = the model's
sampling calls inside it (`Engine.generate`; `_generate_single_turn`); log-probs = the no-grad
pi_old and reference passes (`update.behaviour_logprobs`; `_get_per_token_logps_and_entropies`
without grad); the rest of the step is the PPO update. LM-head rows are counted by a hook on
the policy's and the reference's output layer, outside the rollout.

    .venv/bin/python bench/peer_trl.py --steps 1 --tasks 2   # a quick look
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import defaultdict
from pathlib import Path

import peer_trl_env as penv


class Clock:
    """Seconds and counts per name, taken (and reset) once per RL step."""

    def __init__(self):
        self.in_rollout = False  # LM-head rows are counted outside the rollout only
        self.s: dict[str, float] = defaultdict(float)
        self.n: dict[str, float] = defaultdict(float)

    def wrap(self, obj, attr: str, name: str, when=None, count=None, rollout: bool = False):
        """Time every call of obj.attr (when `when()` holds) under `name`; count(args) returns
        {counter: amount} to add; rollout: the call is (part of) a rollout."""
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):
            if when is not None and not when():
                return fn(*args, **kwargs)
            for key, amount in (count(args) if count else {}).items():
                self.n[key] += amount
            self.in_rollout |= rollout
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.s[name] += time.perf_counter() - t0
                self.in_rollout = self.in_rollout and not rollout

        setattr(obj, attr, timed)

    def count_head_rows(self, models) -> None:
        """Count the rows the models' LM heads compute outside the rollout (the update), and
        time those forwards (the backward is not separable)."""
        started = []

        def pre(module, inputs):
            if not self.in_rollout:
                self.n["head_rows"] += inputs[0].shape[:-1].numel()
                started.append(time.perf_counter())

        def post(module, inputs, output):
            if started:
                self.s["head_forward"] += time.perf_counter() - started.pop()

        for m in models:
            m.get_output_embeddings().register_forward_pre_hook(pre)
            m.get_output_embeddings().register_forward_hook(post)

    def time_optimizer(self, optimizer) -> None:
        """Time its steps through the optimizer's own hooks (`step` stays as the LR scheduler
        wrapped it)."""
        began = []

        def pre(*_):
            began.append(time.perf_counter())

        def post(*_):
            self.s["optimizer"] += time.perf_counter() - began.pop()

        optimizer.register_step_pre_hook(pre)
        optimizer.register_step_post_hook(post)

    def take(self) -> dict:
        out = {**{f"{k}_s": v for k, v in self.s.items()}, **self.n}
        self.s.clear()
        self.n.clear()
        return out


def goals_by_task(task_ids: list[str], goals: list) -> dict[str, list]:
    """{task id: sorted reward tokens of its group}: what the two sides must agree on."""
    out: dict[str, list] = defaultdict(list)
    for t, g in zip(task_ids, goals, strict=True):
        out[t].append(g)
    return {t: sorted(map(str, gs)) for t, gs in sorted(out.items())}


def groups_stats(rewards: list[float], task_ids: list[str]) -> tuple[float, float]:
    """(mean reward, fraction of zero-variance groups) of one batch, grouped by task."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for r, t in zip(rewards, task_ids, strict=True):
        by_task[t].append(r)
    zero = sum(max(g) == min(g) for g in by_task.values()) / len(by_task)
    return sum(rewards) / len(rewards), zero


# -- the two sides -----------------------------------------------------------------------------
def run_rcgrpo(start: Path, tasks, cfg, rollout_cfg, model_cfg) -> dict:
    """rcgrpo's Trainer from `start`; per step: its metrics + the clock's phases."""
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.models.loading import load_policy
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo import update
    from rcgrpo.training.grpo.trainer import Trainer

    policy = load_policy(model_cfg, adapter_path=start)
    engine = make_engine(rollout_cfg, policy, BFCL)
    clock, rows, stops, goals, seen = Clock(), [], [], [], [0]

    def on_step(m: dict, step: int) -> None:
        prefilled = getattr(engine, "prefilled_tokens", 0)  # HFEngine: prompt tokens run
        rows.append({
            **clock.take(), "step_s": m["perf/step_s"], "rollout_s": m["perf/rollout_s"],
            "reward": m["reward/mean"], "zero_var": m["rollout/zero_variance_frac"],
            "sampled": m["rollout/response_tokens"] * len(stops[-1]),
            "truncated": stops[-1].count("token_budget"), "prefilled": prefilled - seen[0],
            "goals": goals[-1],
        })  # fmt: skip
        seen[0] = prefilled

    trainer = Trainer(
        policy,
        engine,
        tasks,
        cfg,
        BFCL.scorer(cfg.protocol),
        on_step,
        temperature=rollout_cfg.temperature,
    )
    rollout = engine.rollout

    def recording(*args, **kwargs):
        out = rollout(*args, **kwargs)
        stops.append([r.stop_reason for r in out])
        goals.append(goals_by_task([r.task_id for r in out], [r.reward_token for r in out]))
        return out

    engine.rollout = recording
    clock.wrap(engine, "rollout", "rollout", rollout=True)
    clock.wrap(engine, "generate", "generation", count=lambda a: {"generate_calls": 1})
    clock.count_head_rows([m for m in (policy.model, trainer.ref_model) if m is not None])
    clock.time_optimizer(trainer.optimizer)
    behaviour = update.behaviour_logprobs
    clock.wrap(update, "behaviour_logprobs", "logprobs")  # pi_old + reference, no grad
    try:
        trainer.train()
    finally:
        update.behaviour_logprobs = behaviour
    return {"rows": rows, "policy": policy}


def trl_trainer(start: Path, tasks, cfg, rollout_cfg, model_cfg, out: Path, max_completion: int):
    """TRL's GRPOTrainer over rcgrpo's BFCL environment, set to the rcgrpo run's settings.

    Batch: len(tasks) x G rollouts per generation; an optimizer step per micro-batch of
    cfg.micro_batch_size rollouts, accumulated over mini/micro of them (params.yaml: 10 and 10,
    so "bnpo" is the token-mean of each mini-batch, as rcgrpo's); old log-probs are computed at
    generation (steps_per_generation > accumulation), as rcgrpo's pi_old."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from rcgrpo.models.loading import load_policy

    policy = load_policy(model_cfg, adapter_path=start)  # config._name_or_path = start: TRL's ref
    policy.tokenizer.response_template = qwen3_template  # TRL only knows its own template texts
    batch = len(tasks) * cfg.group_size
    mini = cfg.mini_batch_size or batch
    args = GRPOConfig(
        output_dir=str(out), report_to="none", use_cpu=True, bf16=False, disable_tqdm=True,
        activation_checkpointing=False, save_strategy="no", logging_steps=1, seed=cfg.seed,
        per_device_train_batch_size=cfg.micro_batch_size,
        gradient_accumulation_steps=mini // cfg.micro_batch_size,
        steps_per_generation=batch // cfg.micro_batch_size, num_iterations=cfg.inner_epochs,
        max_steps=cfg.steps * cfg.inner_epochs * (batch // mini), num_generations=cfg.group_size,
        learning_rate=cfg.lr, lr_scheduler_type="constant", weight_decay=0.0, warmup_steps=0,
        max_grad_norm=cfg.grad_clip, beta=cfg.kl_coef, epsilon=cfg.clip_eps, loss_type="bnpo",
        scale_rewards="group", use_bias_correction_kl=False, temperature=rollout_cfg.temperature,
        top_p=rollout_cfg.top_p, top_k=0, max_completion_length=max_completion,
        generation_kwargs={"max_new_tokens": rollout_cfg.max_new_tokens},
        max_tool_calling_iterations=rollout_cfg.max_steps - 1,  # at most max_steps messages
    )  # fmt: skip
    env = penv.environment_class(tasks, penv.GoalDraw(tasks, cfg))
    trainer = GRPOTrainer(
        model=policy.model, reward_funcs=[penv.paper_reward], args=args,
        train_dataset=Dataset.from_dict(penv.prompt_rows(tasks, policy.compact_docs)),
        processing_class=policy.tokenizer, environment_factory=penv.factories(env, tasks),
    )  # fmt: skip
    trainer.remove_callback(PrinterCallback)  # the bench prints its own figures
    for task in tasks:  # render (and type arguments with) the tool list rcgrpo's prompt shows
        trainer._env_tools[task.id] = penv.tool_entries(task, policy.compact_docs)
    return trainer, policy


def check_prompts(trainer, policy, tasks) -> None:
    """Wrap TRL's prompt tokenisation: every prompt must be rcgrpo's, token for token."""
    from rcgrpo.chat.prompts import Renderer

    renderer, by_id = Renderer(policy.tokenizer, policy.stop_id), {t.id: t for t in tasks}
    tokenize = trainer._tokenize_prompts

    def checked(prompts):
        out = tokenize(prompts)
        for ids, env in zip(out[0], trainer.environments, strict=True):
            messages, tools = penv.first_prompt(by_id[env.task.id], policy.compact_docs, env.goal)
            if list(ids) != renderer.prompt(messages, tools):
                raise AssertionError(f"TRL's prompt of {env.task.id} differs from rcgrpo's")
        trainer.checked_prompts = getattr(trainer, "checked_prompts", 0) + len(out[0])
        return out

    trainer._tokenize_prompts = checked


@contextlib.contextmanager
def trl_head(clock: Clock, compact: bool):
    """Count the rows TRL's fused LM head scores; compact: score the valid (completion)
    positions only, as TRL does where Triton runs (GPUs). On other devices TRL 1.16 scores every
    position of prompt + completion (fixed tile shapes, for Neuron's compiler): on the CPU
    that is most of its update time (`--trl-cpu-head` keeps it)."""
    import trl.trainer.utils as fused

    saved = fused._use_triton, fused._ChunkedLogProbFunction

    class Counting:
        @staticmethod
        def apply(hidden, *args):
            clock.n["head_rows"] += hidden.shape[0]  # (rows, d): positions projected on V
            t0 = time.perf_counter()
            try:
                return saved[1].apply(hidden, *args)
            finally:
                clock.s["head_forward"] += time.perf_counter() - t0

    fused._ChunkedLogProbFunction = Counting
    if compact:
        fused._use_triton = lambda device: True  # the position choice only, not the kernel
    try:
        yield
    finally:
        fused._use_triton, fused._ChunkedLogProbFunction = saved


def run_trl(start: Path, tasks, cfg, rollout_cfg, model_cfg, out: Path, max_completion: int,
            compact_head: bool = True):  # fmt: skip
    """TRL's run from `start`; per RL step (= one generation): the same row as rcgrpo's."""
    import torch
    from transformers import TrainerCallback

    trainer, policy = trl_trainer(start, tasks, cfg, rollout_cfg, model_cfg, out, max_completion)
    check_prompts(trainer, policy, tasks)
    clock, rows, batch = Clock(), [], {}
    per_step = trainer.args.max_steps // cfg.steps  # optimizer steps per generation
    clock.wrap(trainer, "_generate", "rollout", rollout=True)
    clock.wrap(trainer, "_generate_single_turn", "generation", count=lambda a: {
        "generate_calls": 1, "prefilled": sum(map(len, a[0])),  # the whole context, each time
        "prefilled_padded": len(a[0]) * max(map(len, a[0]))})  # fmt: skip
    clock.wrap(trainer, "_calculate_rewards", "scoring")
    clock.wrap(
        trainer,
        "_get_per_token_logps_and_entropies",
        "logprobs",
        when=lambda: not torch.is_grad_enabled(),
    )  # old + reference log-probs
    reward = trainer.reward_funcs[0]

    def paper_reward(environments, **kwargs):
        rewards = reward(environments, **kwargs)
        ids = [e.task.id for e in environments]
        mean, zero = groups_stats(rewards, ids)
        batch.update(
            reward=mean, zero_var=zero, goals=goals_by_task(ids, [e.goal for e in environments])
        )
        return rewards

    trainer.reward_funcs[0] = paper_reward

    class Steps(TrainerCallback):
        t0, t1, wall = 0.0, 0.0, 0.0

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.t1 = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            clock.s["optimizer"] += time.perf_counter() - self.t1

        def on_step_end(self, args, state, control, **kw):
            self.wall += time.perf_counter() - self.t0
            if state.global_step % per_step:
                return
            phases = clock.take()
            sampled = sum(int((b["completion_mask"] * b["tool_mask"]).sum())
                          for b in trainer._buffered_inputs)  # fmt: skip
            rows.append({**batch, **phases, "step_s": self.wall, "sampled": sampled,
                         "rollout_s": phases.get("rollout_s", 0) + phases.get("scoring_s", 0)})  # fmt: skip
            self.wall = 0.0

    trainer.add_callback(Steps())
    with trl_head(clock, compact_head):
        trainer.train()
    logged = [h for h in trainer.state.log_history if "completions/clipped_ratio" in h]
    for row, h in zip(rows, logged, strict=False):
        row["truncated"] = round(h["completions/clipped_ratio"] * len(tasks) * cfg.group_size)
        row["trl_zero_var"] = h.get("frac_reward_zero_std")
    return {"rows": rows, "policy": dataclasses.replace(policy, model=trainer.model),
            "checked_prompts": getattr(trainer, "checked_prompts", 0)}  # fmt: skip
