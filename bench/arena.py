"""Benchmark: RC-GRPO against GRPO and the other zero-variance fixes, at equal budgets, with the
training run as the unit, every arm-run an MLflow run.

Design (docs/zero-variance.md, "The arena"): a pool of `--tasks` short base train tasks
(bench/arena_setup.py: 26 by default, rollout.max_new_tokens 128), `--starts` RCTP-FT starts
built once and cached, `--seeds` RL seeds per start: every arm runs once per (start, seed), from
the same weights with the same seeds, so the arms' runs pair. Each arm stops at the same sampled
token budget (`--budget`, `rl.generated_token_budget`) and is evaluated at `--points` budget
points with the policy of its last step at or before each point (a step that crosses a point
is not counted for it): success under the high goal, greedy, on the pool (in-sample), on value
variants of the pool never trained on (held-out values) and on unseen short test scenarios
(a floor); at the last point also sampled (T = 1) and under the low goal (the controllability
gap). Every arm-run is one MLflow run in the experiment `arena` (MLFLOW_TRACKING_URI's store,
else the project's) with tags arm, start, seed, arena.id and the start's cache key and md5, the
commit, and the resolved config as config.json; the table and the statistics
(bench/arena_report.py, planned before the run) are computed from those runs alone. The whole
arena is one Prefect flow with a task per arm-run, reporting to PREFECT_API_URL, `rcgrpo ui`'s
server, or a Prefect server of its own that stops with it (rcgrpo.flow_server).

    .venv/bin/python bench/arena.py --seeds 0 --steps 1 --arms rc-grpo grpo --tasks 4   # smoke
    .venv/bin/python bench/arena.py --pilot                  # the start's held-out-value success
    .venv/bin/python bench/arena.py --budget B               # the full arena (hours on 2 cores)
    .venv/bin/python bench/arena.py --budget B --id X --start 0 &  # the same on both cores:
    .venv/bin/python bench/arena.py --budget B --id X --start 1    #   one process per start
    .venv/bin/python bench/arena.py report                   # the last arena's table, from MLflow
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import json
import time
import uuid
from pathlib import Path

import arena_setup as setup

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.runtime import apply_defaults

# name -> (variant, `rcgrpo run --set` pairs): the arm, exactly as a user runs it
ARMS = {
    "rc-grpo": ("rctp+rc-grpo", []),
    "grpo": ("rctp+grpo", []),
    "grpo+sign": ("rctp+grpo", ["rl.advantage=sign"]),
    "grpo+presample": ("rctp+grpo", ["rl.task_prefilter=no_signal", "rl.rollouts_per_task=10"]),
    "grpo+dzv+refill": (
        "rctp+grpo",
        ["rl.group_filter=drop_zero_variance", "rl.refill=oversample"],
    ),
    "grpo+top-var": ("rctp+grpo", ["rl.group_filter=top_variance"]),
    "grpo+T1.3": ("rctp+grpo", ["rollout.temperature=1.3"]),
    "rc-grpo+dzv": ("rctp+rc-grpo", ["rl.group_filter=drop_zero_variance"]),
}
DEFAULT_ARMS = ["rc-grpo", "grpo", "grpo+sign", "grpo+presample"]
# at 64 new tokens a message only 21 of the 26 pool tasks can be solved at all
FIXED = ["rollout.max_new_tokens=128"]
# the starts' RCTP-FT: the CPU default's 100 epochs are 400 optimizer steps on its 8 tasks; on
# the 26-task pool (52 rows, batch 4) 30 epochs are 390 steps
START = ["rctp.epochs=30"]
STEP_CAP = 60  # rl.steps: a cap only; the budget stops a run


def arm_config(params: dict, preset: str, arm: str, seed: int, out: Path, extra: list[str]):
    """The resolved RunConfig of `rcgrpo run --preset P --variant V --set ...` for the arm."""
    from rcgrpo.config import parse_sets
    from rcgrpo.run_config import resolve

    variant, sets = ARMS[arm]
    pairs = [*FIXED, *sets, f"rl.seed={seed}", "rl.save_every=0", f"rl.out_dir={out}", *extra]
    return resolve(params, preset, variant, parse_sets(pairs, sectioned=True, together=False))


def with_sets(params: dict, preset: str, pairs: list[str]) -> dict:
    """params with `--set section.key=value` pairs laid over the preset's layer (over
    params.yaml's sections, the CPU default, when there is no preset), so the starts, their
    cache keys and every arm see them."""
    from rcgrpo.config import parse_sets

    sets = parse_sets(pairs, sectioned=True, together=False)
    if not preset:
        return {**params, **{k: {**(params.get(k) or {}), **v} for k, v in sets.items()}}
    layer = dict(params["presets"].get(preset) or {})
    for section, fields in sets.items():
        layer[section] = {**(layer.get(section) or {}), **fields}
    return {**params, "presets": {**params["presets"], preset: layer}}


class Points:
    """The log_metrics hook of one arm-run: keeps the weights after every step and, when a step
    takes the sampled tokens past a budget point, evaluates the weights from before that step."""

    def __init__(self, policy, budgets: list[int], evaluate):
        self.policy, self.budgets, self.evaluate = policy, list(budgets), evaluate
        self.prev = copy.deepcopy(policy.model.state_dict())
        self.prev_tokens, self.prev_step, self.done = 0, 0, []

    def __call__(self, metrics: dict, step: int) -> None:
        total = metrics["rollout/generated_tokens_total"]
        while self.budgets and total > self.budgets[0]:
            self._at(self.prev, self.prev_tokens, self.prev_step)
        self.prev = copy.deepcopy(self.policy.model.state_dict())
        self.prev_tokens, self.prev_step = total, step

    def finish(self) -> None:
        """Points the run did not cross (its step cap came first) get its last weights."""
        while self.budgets:
            self._at(self.prev, self.prev_tokens, self.prev_step)

    def _at(self, state, tokens: float, step: int) -> None:
        budget = self.budgets.pop(0)
        self.done.append(self.evaluate(len(self.done), budget, state, tokens, step))


def run_arm(arm, k, seed, start_policy, start_info, ctx) -> dict:
    """One arm-run: train from start k with RL seed `seed`, evaluating at the budget points;
    logged as one MLflow run. Returns its summary (also the run's metrics)."""
    from rcgrpo.evaluation.variants import get_variant
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.tracking import runs as tracking
    from rcgrpo.training.grpo.trainer import Trainer

    out = ctx["out"] / f"start{k}" / f"seed{seed}" / arm
    extra = [f"rl.steps={ctx['steps']}"]
    if ctx["budget"]:
        extra.append(f"rl.generated_token_budget={ctx['budget']}")
    rc = arm_config(ctx["params"], ctx["preset"], arm, seed, out / "rl", extra)
    tags = {"arm": arm, "start": k, "seed": seed, "arena.id": ctx["id"], "start.key": start_info["key"],
            "start.md5": start_info["md5"], "pool": len(ctx["sets"]["in_sample"])}  # fmt: skip
    with tracking.start_run(f"{arm} start{k} seed{seed}", config=rc.to_dict(), tags=tags,
                            experiment="arena") as run:  # fmt: skip
        run_id = run.info.run_id
        tracking.log_dict(run_id, ctx["plan"], "analysis_plan.json")
        policy = copy.deepcopy(start_policy)  # every arm of a (start, seed) from the same weights
        judge = copy.deepcopy(start_policy)  # holds the weights evaluated at a budget point
        token = get_variant(ARMS[arm][0]).eval_tokens[0]

        def evaluate(j, budget, state, tokens, step):
            """Point j, under the arm's headline goal (high): the pool (greedy and sampled) at
            every point; at the last one also the held-out values and unseen scenarios (greedy)
            and the pool under the low goal."""
            judge.model.load_state_dict(state)
            where, sets = out / f"point{j}", ctx["sets"]
            metrics = {"arena/point_budget": budget, "arena/point_tokens": tokens, "arena/point_step": step}  # fmt: skip
            runs = [(token, {"in_sample": sets["in_sample"]}, ("greedy", "sampled"))]
            if j == len(ctx["budgets"]) - 1:
                held = {k: sets[k] for k in ("heldout_values", "unseen")}
                runs += [(token, held, ("greedy",)), ("low", {"in_sample": sets["in_sample"]}, ("greedy",))]  # fmt: skip
            per_task = {}
            for goal, chosen, modes in runs:
                got = setup.evaluate_sets(judge, rc.rollout, chosen, goal, where / goal, modes)
                for name, by_mode in got["counts"].items():
                    for mode, (kk, n) in by_mode.items():
                        suffix = "" if goal == token else f"_{goal}"
                        metrics[f"arena/{name}/{mode}{suffix}"] = kk / n if n else 0.0
                per_task |= {f"{k}/{goal}": v for k, v in got["per_task"].items()}
            tracking.log_dict(run_id, per_task, f"per_task_point{j}.json")
            tracking.log_metrics(run_id, metrics, j)
            return metrics

        points = Points(policy, ctx["budgets"], evaluate)

        def log(metrics: dict, step: int) -> None:
            tracking.log_metrics(run_id, metrics, step)
            points(metrics, step)

        t0 = time.perf_counter()
        engine = make_engine(rc.rollout, policy, BFCL)
        scorer = BFCL.scorer(rc.rl.protocol)
        trainer = Trainer(policy, engine, ctx["tasks"], rc.rl, scorer, log_metrics=log,
                          temperature=rc.rollout.temperature)  # fmt: skip
        history = trainer.train()
        wall = time.perf_counter() - t0
        points.finish()
        used = history[: int(points.done[-1]["arena/point_step"])]  # what the last point cost
        summary = {
            "arena/steps": len(used),
            "arena/steps_run": len(history),
            "arena/wall_s": wall,
            **{f"arena/{k}": sum(m.get(f"rollout/{k}", 0.0) for m in used)
               for k in ("generated_tokens", "prompt_tokens", "prefill_tokens", "generated")},
            "arena/update_tokens": sum(m.get("perf/update_tokens", 0.0) for m in used),
            "arena/optimizer_steps": sum(m.get("loss/optimizer_steps", 0.0) for m in used),
        }  # fmt: skip
        tracking.log_metrics(run_id, summary, 0)
    return {**summary, "points": points.done}


def run_arena(args) -> str:
    """Every arm over every (start, seed), as one Prefect flow; returns the arena id."""
    apply_defaults()  # before prefect reads its settings (the ephemeral server's start-up timeout)
    from arena_report import PLAN
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    from rcgrpo.config import read_params

    arms = [a for a in args.arms if a in ARMS]
    if unknown := sorted(set(args.arms) - set(ARMS)):
        raise SystemExit(f"error: unknown arm(s) {unknown}; the arms are {sorted(ARMS)}")
    params = with_sets(read_params(), args.preset, [*START, *args.set])
    budgets = [round(args.budget * (j + 1) / args.points) for j in range(args.points)] if args.budget else [0]  # fmt: skip
    ctx = {"params": params, "preset": args.preset, "out": Path(args.out), "budget": args.budget,
           "steps": args.steps or STEP_CAP, "id": args.id or uuid.uuid4().hex[:12], "plan": PLAN,
           "budgets": budgets if args.budget else [float("inf")]}  # fmt: skip

    @task(cache_policy=NO_CACHE, name="arm-run")
    def arm_run(arm, k, seed, start_policy, start_info):
        return run_arm(arm, k, seed, start_policy, start_info, ctx)

    @flow(name="arena", log_prints=True, validate_parameters=False)
    def arena_flow() -> str:
        t0 = time.perf_counter()
        pool, mixed = setup.pool_and_data(params, args.preset, args.tasks, {})
        ctx["tasks"], ctx["sets"] = pool, setup.heldout_sets(pool)
        print(f"arena {ctx['id']}: pool {len(pool)} tasks, held-out values "
              f"{len(ctx['sets']['heldout_values'])}, unseen {len(ctx['sets']['unseen'])}; "
              f"arms {arms}; starts {args.starts}; seeds {args.seeds}; budgets {ctx['budgets']}")  # fmt: skip
        for k in [args.start] if args.start >= 0 else range(args.starts):
            policy, info = setup.start(params, args.preset, pool, mixed, k, Path(args.cache))
            for seed in args.seeds:
                for arm in arms:
                    r = arm_run(arm, k, seed, policy, info)
                    last = r["points"][-1]
                    print(f"start {k} seed {seed} {arm:15s} {r['arena/steps']} steps, "
                          f"{r['arena/generated_tokens']:.0f} tokens, in-sample sampled "
                          f"{last['arena/in_sample/sampled']:.3f}, held-out values greedy "
                          f"{last['arena/heldout_values/greedy']:.3f} ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
        return ctx["id"]

    from rcgrpo.flow_server import prefect_for_flows
    from rcgrpo.tracking import runs as tracking

    store = tracking.store_dir()
    store.mkdir(parents=True, exist_ok=True)
    with (store / ".arena.lock").open("w") as lock:  # one process per start: one creates the
        fcntl.flock(lock, fcntl.LOCK_EX)  # store and its tables, the others wait for it
        tracking.configure(experiment="arena")
    with contextlib.ExitStack() as stack:  # a Prefect server of its own stops with the arena
        prefect_for_flows(stack)
        return arena_flow()


def pilot(args) -> None:
    """The held-out-value success of one fine-tuned start (before RL), with n."""
    from rcgrpo.config import read_params

    apply_defaults()
    params = with_sets(read_params(), args.preset, [*START, *args.set])
    pool, mixed = setup.pool_and_data(params, args.preset, args.tasks, {})
    sets = setup.heldout_sets(pool)
    policy, info = setup.start(params, args.preset, pool, mixed, 0, Path(args.cache))
    rc = arm_config(params, args.preset, "rc-grpo", 0, Path(args.out) / "pilot", [])
    got = setup.evaluate_sets(policy, rc.rollout, sets, "high", Path(args.out) / "pilot",
                              ("greedy", "sampled"))  # fmt: skip
    print(
        f"start 0 ({info['key']}, md5 {info['md5']}), high goal, paper reward, combined protocol:"
    )
    for name, by_mode in got["counts"].items():
        print(f"  {name:15s} " + "  ".join(f"{m} {k}/{n} = {100 * k / n:.1f} %" for m, (k, n) in by_mode.items()))  # fmt: skip
    (Path(args.out) / "pilot" / "pilot.json").write_text(json.dumps(got["counts"]) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="run", choices=["run", "report"],
                        help="run the arena, or reprint an arena's table from MLflow")  # fmt: skip
    parser.add_argument("--id", default="", help="the arena id (run: default a new one; report: the last)")  # fmt: skip
    parser.add_argument("--start", type=int, default=-1,
                        help="run only this start (one process per start and core, same --id)")  # fmt: skip
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, help=f"of {list(ARMS)}")
    parser.add_argument("--tasks", type=int, default=26, help="pool: short base train tasks")
    parser.add_argument("--starts", type=int, default=2, help="fine-tuned starts (cached)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="RL seeds per start")  # fmt: skip
    parser.add_argument("--budget", type=int, default=0, help="sampled tokens per arm-run (0: --steps)")  # fmt: skip
    parser.add_argument("--points", type=int, default=3, help="budget points evaluated")
    parser.add_argument("--steps", type=int, default=0, help=f"RL steps cap (0 = {STEP_CAP})")
    parser.add_argument("--preset", default="", help="params.yaml preset on top (default: none)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a params.yaml field for starts and arms (repeatable)")  # fmt: skip
    parser.add_argument("--pilot", action="store_true", help="only the start's held-out success")
    parser.add_argument("--out", default="outputs/bench/arena", help="results folder")
    parser.add_argument("--cache", default="cache/arena/starts", help="fine-tuned starts' cache")
    args = parser.parse_args()
    if args.command == "report":
        from arena_report import report

        return print(report(args.id))
    if args.pilot:
        return pilot(args)
    arena_id = run_arena(args)
    from arena_report import report

    print(report(arena_id))


if __name__ == "__main__":
    main()
