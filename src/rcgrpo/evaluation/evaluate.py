"""Held-out evaluation on the run's environment: roll out, score every named check, summarise
with Wilson intervals.

For each requested reward token (default <|high_reward|>; add <|low_reward|> for the
controllability gap, `none` for a model trained without goals) and seed, every task is rolled out
once by the engine, scored by the environment's scorer (BFCL: the paper's R and BFCL's official
check), and each check summarised per category, pooled (BFCL: k/80) and as the unweighted
category mean, each with a Wilson 95% interval (`rcgrpo.evaluation.stats`).

Defaults, and why: greedy decoding (temperature 0; bfcl-eval's leaderboard runs at ~0, and a
sampled score needs many seeds to mean anything); the headline protocol is the one the model was
trained with (`protocol: trained`, read from the saved policy: a model trained on the combined
"Step 1..n" prompt is scored on it), and the other protocol is reported beside it for the first
token (`other_protocol`), so a number is never quoted without the protocol it was measured with.
`task_file` restricts the tasks to those of a dataset file (e.g. the RL tasks, split "train").
BFCL's results are also written in bfcl-eval's result-file layout,

    <out>/bfcl_results/<model>-<token>-s<seed>[-combined]/multi_turn/BFCL_v4_multi_turn_<category>_result.json

one JSON line per entry {"id", "result"}, result = per turn, per step, the model's decoded output
as a prompting model writes it ("[cd(folder='a'), ls()]"), so bfcl-eval's evaluator can score it.

    rcgrpo stage eval --model outputs/rl/final --set tokens=[high,low] --set seeds=[0,1]
    rcgrpo stage eval_rl_tasks_before            # the fine-tuned model on the RL tasks
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.evaluation.config import EvalConfig
from rcgrpo.evaluation.export import write_bfcl_results
from rcgrpo.evaluation.stats import summarise
from rcgrpo.rollout.environment import Environment

TOKENS = {"high": HIGH, "low": LOW, "none": None}
LogMetrics = Callable[[dict, int], None]


def resolve_protocol(cfg: EvalConfig, env: Environment, model_path=None) -> EvalConfig:
    """cfg with protocol "trained" replaced by the protocol the saved policy was trained with
    (models.trained_protocol); a model with none recorded (a base model) gets the
    environment's own (the first of env.protocols: BFCL's "bfcl")."""
    if cfg.protocol != "trained":
        return cfg
    from dataclasses import replace

    from rcgrpo.models.loading import trained_protocol

    found = trained_protocol(model_path) if model_path else None
    return replace(cfg, protocol=found if found in env.protocols else env.protocols[0])


def other(protocol: str, env: Environment) -> str | None:
    """The environment's other protocol (BFCL: combined <-> bfcl), None if it has one."""
    rest = [p for p in env.protocols if p != protocol]
    return rest[0] if rest else None


@dataclass
class Outcome:
    """One scored rollout of one task under one reward token and seed."""

    task_id: str
    category: str
    token: str  # "high" | "low" | "none"
    seed: int
    protocol: str
    checks: dict  # check name -> value (the scorer's Rewards.checks; BFCL: paper, bfcl 0/1)
    calls: list = field(default_factory=list)  # turn -> step -> call strings
    reasons: dict = field(default_factory=dict)

    def row(self) -> dict:
        """Its outcomes.jsonl line: the checks by name beside the other fields."""
        row = asdict(self)
        checks, calls, reasons = row.pop("checks"), row.pop("calls"), row.pop("reasons")
        return {**row, **checks, "calls": calls, "reasons": reasons}


def eval_tasks(cfg: EvalConfig, env: Environment) -> list:
    """The tasks of `env` cfg names: its split (or those of cfg.task_file), its categories."""
    if cfg.task_file:
        from rcgrpo.data.dataset import tasks_of

        keep = set(cfg.categories or env.categories)
        tasks = [t for t in tasks_of(cfg.task_file, cfg.split, env) if t.category in keep]
    else:
        tasks = env.tasks(cfg.split, tuple(cfg.categories))
    if cfg.limit:
        per: dict[str, int] = {}
        kept = []
        for t in tasks:
            per[t.category] = per.get(t.category, 0) + 1
            if per[t.category] <= cfg.limit:
                kept.append(t)
        tasks = kept
    return tasks


def outcome_of(task, rollout, protocol: str, token: str, seed: int, scorer) -> Outcome:
    """The rollout scored by `scorer` (rcgrpo.rollout.environment.Scorer: the environment's
    under `protocol`, which reads the checks an agent_loop.Rollout already carries)."""
    rewards = scorer(task, rollout)
    calls = getattr(rollout, "calls", [])
    checks, reasons = dict(rewards.checks), dict(rewards.reasons)
    return Outcome(task.id, task.category, token, seed, protocol, checks, calls, reasons)


def summarise_outcomes(outcomes: list[Outcome], protocol: str) -> dict:
    """Nested report: runs[token][seed][checker] = summary, plus seed means and the gap.

    gap[checker] = pooled(high) - pooled(low) per seed (same tasks, same seed), and its mean.
    """
    runs: dict = {}
    checkers = list(dict.fromkeys(name for o in outcomes for name in o.checks))  # BFCL: paper, bfcl
    for token in sorted({o.token for o in outcomes}):
        runs[token] = {}
        for seed in sorted({o.seed for o in outcomes if o.token == token}):
            chosen = [o for o in outcomes if o.token == token and o.seed == seed]
            runs[token][seed] = {
                checker: _to_dicts(summarise([(o.category, o.checks[checker]) for o in chosen]))
                for checker in checkers
            }
    report: dict = {"protocol": protocol, "n_tasks": 0, "runs": runs, "seed_mean": {}, "gap": {}}
    if outcomes:
        report["n_tasks"] = len({o.task_id for o in outcomes})
    for token, by_seed in runs.items():
        report["seed_mean"][token] = {}
        for checker in checkers:
            values = [s[checker]["pooled"]["value"] for s in by_seed.values()]
            report["seed_mean"][token][checker] = {
                "pooled_mean": statistics.fmean(values),
                "pooled_std": statistics.pstdev(values) if len(values) > 1 else 0.0,
                "n_seeds": len(values),
            }
    if "high" in runs and "low" in runs:
        seeds = sorted(set(runs["high"]) & set(runs["low"]))
        for checker in checkers:
            per_seed = [
                runs["high"][s][checker]["pooled"]["value"]
                - runs["low"][s][checker]["pooled"]["value"]
                for s in seeds
            ]
            report["gap"][checker] = {
                "per_seed": per_seed,
                "mean": statistics.fmean(per_seed) if per_seed else 0.0,
            }
    return report


def _to_dicts(summary: dict) -> dict:
    return {
        "pooled": summary["pooled"].to_dict(),
        "category_mean": summary["category_mean"].to_dict(),
        "per_category": {c: a.to_dict() for c, a in summary["per_category"].items()},
    }


def flat_metrics(report: dict, prefix: str = "eval") -> dict[str, float]:
    """<prefix>/<checker>/<token>/{pooled,category_mean,<category>} for the first seed's run,
    <prefix>/<checker>/<token>/seed_mean and <prefix>/<checker>/gap for the headline protocol;
    the same under <prefix>/<protocol>_protocol/ for each other protocol evaluated."""
    out: dict[str, float] = {}
    for token, by_seed in report["runs"].items():
        first = by_seed[min(by_seed)]
        for checker, s in first.items():
            name = f"{prefix}/{checker}/{token}"
            out[f"{name}/pooled"] = s["pooled"]["value"]
            out[f"{name}/pooled_low"] = s["pooled"]["low"]
            out[f"{name}/pooled_high"] = s["pooled"]["high"]
            out[f"{name}/category_mean"] = s["category_mean"]["value"]
            for c, a in s["per_category"].items():
                out[f"{name}/{c}"] = a["value"]
            out[f"{name}/seed_mean"] = report["seed_mean"][token][checker]["pooled_mean"]
    for checker, g in report["gap"].items():
        out[f"{prefix}/{checker}/gap"] = g["mean"]
    for protocol, sub in (report.get("other_protocols") or {}).items():
        out.update(flat_metrics(sub, f"{prefix}/{protocol}_protocol"))
    return out


def evaluate(
    engine,
    cfg: EvalConfig,
    log_metrics: LogMetrics | None = None,
    step: int = 0,
    tasks: list | None = None,
    on_rollouts: Callable[[dict, list], None] | None = None,
    environment: Environment | None = None,
) -> dict:
    """Roll out every task once per (token, seed) through `engine`, score, summarise, write.

    engine: anything with `rollout(tasks, reward_tokens, protocol, seed) -> list[Rollout]`
    (rcgrpo.rollout.engine; its temperature is the engine's). cfg.protocol must be resolved (not
    "trained": see resolve_protocol). With other_protocol, tokens[0] is also rolled out in the
    other protocol, summarised in report["other_protocols"][protocol].
    on_rollouts(info, rollouts): called after each pass with its rollouts and info = {"seed",
    "protocol", "token", "start_ns"} (the pipeline writes episode traces with it).
    environment: the run's (rcgrpo.rollout.environment; required: `tasks` are its tasks), whose
    scorer scores each pass; only BFCL's outcomes are also written as bfcl-eval result files.
    Writes <out_dir>/report.json, outcomes.jsonl and bfcl_results/; returns the report.
    """
    if environment is None:
        raise ValueError("evaluate: no environment (the run's: rcgrpo.envs.get(rc.env))")
    if cfg.protocol not in environment.protocols:
        raise ValueError(f"eval protocol {cfg.protocol!r}: resolve it first (resolve_protocol)")
    tasks = tasks if tasks is not None else eval_tasks(cfg, environment)
    plan = [(cfg.protocol, token) for token in cfg.tokens]
    if cfg.other_protocol and other(cfg.protocol, environment):
        plan.append((other(cfg.protocol, environment), cfg.tokens[0]))
    outcomes: list[Outcome] = []
    for seed in cfg.seeds:
        for protocol, token in plan:
            info = {"seed": seed, "protocol": protocol, "token": token, "start_ns": time.time_ns()}
            rollouts = engine.rollout(tasks, [TOKENS[token]] * len(tasks), protocol, seed)
            if on_rollouts is not None:
                on_rollouts(info, rollouts)
            scorer = environment.scorer(protocol)
            for task, r in zip(tasks, rollouts, strict=True):
                outcomes.append(outcome_of(task, r, protocol, token, seed, scorer))
    report = summarise_outcomes([o for o in outcomes if o.protocol == cfg.protocol], cfg.protocol)
    report["other_protocols"] = {
        p: summarise_outcomes([o for o in outcomes if o.protocol == p], p)
        for p in sorted({o.protocol for o in outcomes} - {cfg.protocol})
    }
    report["config"] = asdict(cfg)
    report["categories"] = list(environment.categories)  # the order tables list them in
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    with (out / "outcomes.jsonl").open("w") as fh:
        for o in outcomes:
            fh.write(json.dumps(o.row()) + "\n")
    if environment.name == "bfcl":
        write_bfcl_results(outcomes, out / "bfcl_results", cfg.model_name)
    flat = flat_metrics(report)
    (out / "metrics.json").write_text(json.dumps(flat, indent=1) + "\n")  # for dvc.yaml
    if log_metrics is not None:
        log_metrics(flat, step)
    return report


def run_eval(
    cfg: EvalConfig,
    model_cfg,
    model_path,
    env: Environment,
    rollout_cfg=None,
    log_metrics=None,
    backend=None,
    on_rollouts=None,
) -> dict:
    """Load a saved policy and evaluate it on `env` (the run's environment) with the rollout
    engine (rcgrpo.rollout.engine), at cfg.temperature (greedy by default) whatever the rollout
    section's sampling temperature. With vLLM the policy loads on the CPU (models.device.for_engine:
    only its export is served).
    backend: an rcgrpo.rollout.execution Backend (local or Ray workers; None = one local engine)."""
    from dataclasses import replace

    from rcgrpo.models.device import for_engine
    from rcgrpo.models.loading import load_policy
    from rcgrpo.rollout.config import RolloutConfig, for_inference
    from rcgrpo.rollout.execution import RolloutSpec, make_engine
    from rcgrpo.rollout.router import visible_gpus

    cfg = resolve_protocol(cfg, env, model_path)
    tasks = eval_tasks(cfg, env)  # before loading the model: a bad task_file fails at once
    rollout_cfg = replace(
        rollout_cfg or RolloutConfig(), protocol=cfg.protocol, temperature=cfg.temperature
    )
    model_cfg = for_engine(model_cfg, rollout_cfg.engine)
    policy = load_policy(model_cfg, adapter_path=model_path)
    util = cfg.vllm_gpu_memory_utilization  # every GPU: no trainer shares them now
    rollout_cfg = for_inference(rollout_cfg, cfg.vllm_servers, util, visible_gpus())
    if backend is None:
        engine = make_engine(rollout_cfg, policy, env)
    else:
        spec = RolloutSpec(model_cfg, str(model_path) if model_path else None, rollout_cfg, env)
        engine = backend.engine(policy, spec)
    with engine:  # its servers stop before the next stage starts its own
        return evaluate(engine, cfg, log_metrics, 0, tasks, on_rollouts, env)
