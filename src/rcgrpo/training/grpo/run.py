"""One RL stage end to end: load the fine-tuned policy, pick the RL tasks, train, save, summarise.

`run_rl` is what `rcgrpo stage rl`, the `rl` stage of dvc.yaml and the pipeline's RL flow call.
The RL tasks are the run environment's tasks of the fine-tuning data (`rl.tasks_from`, default
data/rctp/train.jsonl): RL improves the policy on what it was fine-tuned for, as in the paper,
where both stages use BFCL's 720 train tasks; on a subset (the CPU default) RL stays on that subset
instead of drawing tasks the policy never saw.

    rcgrpo stage rl                                  # params.yaml `rl:` + `model:` + `rollout:`
    rcgrpo stage rl --set tasks_from=""              # every train task (BFCL: 720)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from rcgrpo.training.grpo import engine_is
from rcgrpo.training.grpo.config import RLConfig
from rcgrpo.training.grpo.trainer import LogMetrics, Trainer


def rl_tasks(cfg: RLConfig, env):
    """The tasks of `env` RL draws from: those of cfg.tasks_from (train split only), else all
    its train tasks."""
    from rcgrpo.data.dataset import tasks_of

    return tasks_of(cfg.tasks_from, "train", env) if cfg.tasks_from else env.tasks("train")


def write_summary(out: Path) -> dict:
    """<out>/metrics.json for dvc.yaml: the last step's metrics + run means of the key ones."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = {k: v for k, v in rows[-1].items() if not k.startswith("perf/")}
    for key in ("reward/mean", "rollout/zero_variance_frac", "rollout/within_group_std"):
        summary[f"{key}_run_mean"] = sum(r[key] for r in rows) / len(rows)
    (out / "metrics.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def rl_tags(cfg: RLConfig, model_cfg) -> dict[str, str]:
    """The RL run's tags for what trains: the mode, its learning rate, and the reward-token
    rows (frozen in RL under every engine: the same trainable set with hf and vllm; they train
    in fine-tuning, RCTP-FT, where they get their meaning)."""
    from rcgrpo.models.profiles import PROFILES
    from rcgrpo.training.optim import learning_rate

    lora = PROFILES[model_cfg.profile].lora if model_cfg.lora is None else model_cfg.lora
    return {
        "rl.training_mode": "lora" if lora else "full",
        "rl.reward_rows": "frozen",
        "rl.lr_used": f"{learning_rate(cfg, lora):g}",
    }


def build_trainer(
    cfg: RLConfig,
    model_cfg,
    env,
    rollout_cfg=None,
    log_metrics: LogMetrics | None = None,
    backend=None,
    on_rollouts=None,
) -> Trainer:
    """The RL stage's Trainer: the initial policy (cfg.start_path) loaded on this rank's device,
    its rollout engine (rollout_cfg; through `backend`, rcgrpo.rollout.execution, as the stage
    runs it), the RL tasks and the scorer of `env` (the run's environment, rcgrpo.envs). Every
    check that needs no model runs first (one line each)."""
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.lora import freeze_reward_rows
    from rcgrpo.rollout import colocate
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training import distributed

    rollout_cfg = rollout_cfg or RolloutConfig(protocol=cfg.protocol)
    engine_is.check(cfg, rollout_cfg.temperature)  # before loading the model (Trainer: engine)
    layout = (rollout_cfg.n_servers, rollout_cfg.vllm_devices, rollout_cfg.tensor_parallel_size)
    if distributed.launched() and rollout_cfg.engine == "vllm" and layout != (1, (), 1):
        # each rank starts the servers its engine lists: N ranks x these servers on the same GPUs
        raise ValueError(
            "rollout.vllm_servers / vllm_devices / tensor_parallel_size under a launcher: every "
            "rank would start all of those servers on the same GPUs; leave them at 1 / [] / 1 "
            "(each rank serves on its own GPU) or drive several servers from one process"
        )
    start = Path(cfg.start_path)
    if not start.exists():
        raise FileNotFoundError(
            f"initial model {start} not found: run `rcgrpo stage {cfg.init}` first, "
            "or set rl.init_path to a folder written by save_policy"
        )
    from rcgrpo.training.checkpoint import check_writable

    check_writable(cfg.out_dir)  # before training: an unwritable out_dir fails in a second
    tasks = rl_tasks(cfg, env)  # before loading the model: a missing data file fails in a second
    colocate.trainer_allocator()  # before CUDA initialises: set_device below does
    # under a launcher: this rank's GPU (cuda:LOCAL_RANK), bound before anything loads; the
    # rank then owns its engine on that device (its own vLLM server pinned to it)
    device = distributed.local_device(model_cfg.device)
    policy = load_policy(dataclasses.replace(model_cfg, device=device), adapter_path=start)
    freeze_reward_rows(policy)  # under every engine: see rl_tags
    engine = make_engine(rollout_cfg, policy, env, device=policy.config.device)
    if backend is not None:  # rcgrpo.rollout.execution: the same shards (whole groups)
        if distributed.launched() and backend.ray is not None:
            raise ValueError(
                "execution.backend=ray under a launcher: every rank would start its own Ray "
                "workers; use execution.backend=local (each rank rolls out on its own engine)"
            )
        from rcgrpo.rollout.execution import RolloutSpec

        spec = RolloutSpec(model_cfg, str(start), rollout_cfg, env)
        engine = backend.engine(policy, spec, group=cfg.group_size, local_engine=engine)
    return Trainer(
        policy,
        engine,
        tasks,
        cfg,
        env.scorer(cfg.protocol, cfg.reward or None),
        log_metrics,
        temperature=rollout_cfg.temperature,
        on_rollouts=on_rollouts,
    )


def run_rl(
    cfg: RLConfig,
    model_cfg,
    env,
    rollout_cfg=None,
    log_metrics: LogMetrics | None = None,
    log_artifact: Callable[[Path], None] | None = None,
    resume: bool = False,
    backend=None,
    on_rollouts=None,
) -> Path:
    """Load the initial policy (cfg.start_path), train on the RL tasks of `env` (the run's
    environment, rcgrpo.envs), save <out_dir>/final. on_rollouts: the Trainer's per-step
    rollout callback (episode traces), or None."""
    from rcgrpo.models.loading import save_policy
    from rcgrpo.training import distributed

    trainer = build_trainer(cfg, model_cfg, env, rollout_cfg, log_metrics, backend, on_rollouts)
    policy, engine, tasks = trainer.policy, trainer.engine, trainer.tasks
    trainer.out.mkdir(parents=True, exist_ok=True)
    (trainer.out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
    (trainer.out / "tasks.json").write_text(json.dumps([t.id for t in tasks], indent=1))
    with engine:  # its servers stop when training ends, however it ends
        trainer.train(resume=resume)
    if not distributed.is_main():  # under `accelerate launch` rank 0 saves (same weights)
        return trainer.out / "final"
    training = {
        "stage": "rl",
        "env": env.name,
        "protocol": cfg.protocol,
        "init": cfg.init,
        "conditioning": cfg.conditioning,
        "p_high": cfg.p_high,
    }
    final = save_policy(policy, trainer.out / "final", training)
    write_summary(trainer.out)
    if log_artifact is not None:
        log_artifact(final)
    return final
