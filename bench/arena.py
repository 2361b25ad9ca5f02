"""Benchmark: RC-GRPO against the other fixes for zero-variance groups, at an equal budget.

Every arm starts from the same RCTP-FT model (one per seed, params.yaml's CPU default, as `make run`
trains it), trains on the same RL tasks with the same seeds, and stops once its rollouts have
sampled the same number of tokens (`rl.generated_token_budget`): a filter that over-samples
gets fewer steps, not more compute. The budget of a seed is what the first arm (RC-GRPO) samples
in the preset's `rl.steps`; every other arm may take up to ARM_STEP_CAP x as many steps to
spend it. Each arm is one `rcgrpo run --variant V --set ...` away (ARMS).

Printed per arm: reward/mean first -> last quarter of its steps (and, for RC arms, the reward of
the high-goal rollouts: half of an RC group is asked to fail, so its mean is not GRPO's), the
zero-variance and effective-group fractions, steps and generated tokens, greedy and sampled
(T = 1, 4 per task) success on the RL tasks before -> after RL under the high goal (k/n, Wilson
95 %), and the difference to RC-GRPO after RL with a paired bootstrap 95 % interval over
(seed, task) units. A PNG plots reward against generated tokens.

    .venv/bin/python bench/learning.py --arms all                    # 7 arms x 3 seeds
    .venv/bin/python bench/arena.py --seeds 0 --steps 2 --arms rc-grpo grpo   # a smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

from learning import SAMPLES, build_data, fine_tune, fmt, success

from rcgrpo.runtime import apply_defaults

# name -> (variant, `rcgrpo run --set` pairs): the arm, exactly as a user runs it
ARMS = {
    "rc-grpo": ("rctp+rc-grpo", []),
    "grpo": ("rctp+grpo", []),
    "grpo+dzv+refill": (
        "rctp+grpo",
        ["rl.group_filter=drop_zero_variance", "rl.refill=oversample"],
    ),
    "grpo+top-var": ("rctp+grpo", ["rl.group_filter=top_variance"]),
    "grpo+sign": ("rctp+grpo", ["rl.advantage=sign"]),
    "grpo+T1.3": ("rctp+grpo", ["rollout.temperature=1.3"]),
    "rc-grpo+dzv": ("rctp+rc-grpo", ["rl.group_filter=drop_zero_variance"]),
}
ARM_STEP_CAP = 3  # an arm may take up to 3 x the reference's steps to spend the same budget


def arm_config(params: dict, preset: str, arm: str, seed: int, out: Path, extra: list[str]):
    """(rl, rollout) sections of `rcgrpo run --preset P --variant V --set ...` for the arm."""
    from rcgrpo.config import parse_sets
    from rcgrpo.run_config import resolve

    variant, sets = ARMS[arm]
    pairs = [*sets, f"rl.seed={seed}", "rl.save_every=0", f"rl.out_dir={out}", *extra]
    rc = resolve(params, preset, variant, parse_sets(pairs, sectioned=True, together=False))
    return rc.rl, rc.rollout


def outcomes(folder: Path) -> dict[str, float]:
    """task id -> success rate in an evaluation folder's outcomes.jsonl (paper reward)."""
    per: dict[str, list[int]] = {}
    for line in (folder / "outcomes.jsonl").read_text().splitlines():
        o = json.loads(line)
        per.setdefault(o["task_id"], []).append(int(o["paper"]))
    return {t: sum(v) / len(v) for t, v in per.items()}


def run_arm(arm, start, tasks, params, preset, seed, extra, out: Path) -> dict:
    from rcgrpo.evaluation.variants import get_variant
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo.trainer import Trainer

    cfg, rollout_cfg = arm_config(params, preset, arm, seed, out / "rl", extra)
    policy = copy.deepcopy(start)  # every arm of a seed starts from the same weights
    engine = make_engine(rollout_cfg, policy)
    history = Trainer(policy, engine, tasks, cfg, temperature=rollout_cfg.temperature).train()
    token = get_variant(ARMS[arm][0]).eval_tokens[0]
    after = success(policy, rollout_cfg, tasks, token, out / "after")
    return {
        "steps": len(history),
        "after": after,
        "per_task": {m: outcomes(out / "after" / m) for m in ("greedy", "sampled")},
        "reward": [m["reward/mean"] for m in history],
        "reward_high": [m.get("reward/mean_high") for m in history],
        "zero_variance": [m["rollout/zero_variance_frac"] for m in history],
        "effective": [m["rollout/effective_group_frac"] for m in history],
        "tokens": [m["rollout/generated_tokens_total"] for m in history],
    }


def quarters(runs: list[dict], key: str) -> str:
    """The mean over seeds of each run's first and last quarter of `key` ("-" if never logged)."""
    pairs = []
    for r in runs:
        vals = [v for v in r[key] if v is not None]
        if vals:
            q = max(1, len(vals) // 4)
            pairs.append((sum(vals[:q]) / q, sum(vals[-q:]) / q))
    if not pairs:
        return "-"
    return f"{mean(p[0] for p in pairs):.3f} -> {mean(p[1] for p in pairs):.3f}"


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def paired(runs, ref_runs, mode: str) -> str:
    """The arm minus RC-GRPO after RL, in points, paired by (seed, task), bootstrap 95 %."""
    from rcgrpo.evaluation.stats import paired_bootstrap

    diffs = [
        a["per_task"][mode][t] - r["per_task"][mode][t]
        for a, r in zip(runs, ref_runs, strict=True)
        for t in r["per_task"][mode]
    ]
    m, lo, hi = paired_bootstrap(diffs)
    return f"{100 * m:+5.1f} [{100 * lo:+5.1f}, {100 * hi:+5.1f}]"


def table(results: dict, before: list[dict]) -> list[str]:
    lines = [
        f"{'arm':16s} {'steps':>5s} {'gen tokens':>10s} {'reward first -> last q':>22s} "
        f"{'high goal':>16s} {'zero-var':>8s} {'effective':>9s}  mode     "
        f"{'success before RL (Wilson 95 %)':32s} {'after RL':32s} minus rc-grpo (paired)"
    ]
    for arm, runs in results.items():
        for mode in ("greedy", "sampled"):
            kb, nb = (sum(b[mode][i] for b in before) for i in (0, 1))
            ka, na = (sum(r["after"][mode][i] for r in runs) for i in (0, 1))
            head = " " * 93
            if mode == "greedy":
                head = (
                    f"{arm:16s} {mean(r['steps'] for r in runs):5.1f} "
                    f"{mean(r['tokens'][-1] for r in runs):10.0f} "
                    f"{quarters(runs, 'reward'):>22s} {quarters(runs, 'reward_high'):>16s} "
                    f"{mean(mean(r['zero_variance']) for r in runs):8.3f} "
                    f"{mean(mean(r['effective']) for r in runs):9.3f}"
                )
            diff = "" if arm == "rc-grpo" else paired(runs, results["rc-grpo"], mode)
            lines.append(f"{head}  {mode:7s}  {fmt(kb, nb)}  {fmt(ka, na)}  {diff}")
    return lines


def plot(results: dict, path: Path) -> Path:
    from rcgrpo.evaluation.plots import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for arm, runs in results.items():
        for ax, key in zip(axes, ("reward", "effective"), strict=True):
            for i, r in enumerate(runs):
                ax.plot(r["tokens"], r[key], color=f"C{list(results).index(arm)}",
                        alpha=0.8, lw=1, label=arm if i == 0 else None)  # fmt: skip
    axes[0].set(
        title="reward/mean per step (each seed)", xlabel="generated tokens", ylabel="reward"
    )
    axes[1].set(title="effective-group fraction", xlabel="generated tokens", ylim=(-0.05, 1.05))
    return save(fig, axes, path, legend=7)


def run_arena(arms: list[str], seeds: list[int], preset: str, steps: int, out: Path) -> None:
    """Every arm in `arms` (RC-GRPO first: it sets each seed's budget) over `seeds`."""
    apply_defaults()
    import torch

    from rcgrpo.config import read_params

    arms = ["rc-grpo", *[a for a in arms if a != "rc-grpo"]]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"error: unknown arm(s) {unknown}; the arms are {sorted(ARMS)}")
    params, t0 = read_params(), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tasks, mixed, _ = build_data(params, preset, Path(tmp) / "data")
    print(f"RL tasks ({len(tasks)}): {[t.id for t in tasks]}; threads {torch.get_num_threads()}")
    results: dict = {arm: [] for arm in arms}
    before = []
    for seed in seeds:
        start, loss = fine_tune("rctp", mixed, params, preset, seed, out / f"s{seed}" / "rctp")
        _, rollout_cfg = arm_config(params, preset, "rc-grpo", seed, out, [])
        before.append(success(start, rollout_cfg, tasks, "high", out / f"s{seed}" / "before"))
        print(f"seed {seed}: rctp fine-tuned, loss {loss:.4f}, before RL {before[-1]} "
              f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
        budget = 0
        for arm in arms:
            extra = [f"rl.steps={steps}"] if steps else []
            if budget:  # the other arms: the reference's tokens, within a step cap
                ref_steps = results["rc-grpo"][-1]["steps"]
                extra = [f"rl.generated_token_budget={budget}", f"rl.steps={ARM_STEP_CAP * ref_steps}"]  # fmt: skip
            r = run_arm(arm, start, tasks, params, preset, seed, extra, out / f"s{seed}" / arm)
            results[arm].append(r)
            budget = budget or int(r["tokens"][-1])
            print(f"seed {seed}: {arm:16s} {r['steps']} steps, {r['tokens'][-1]:.0f} tokens, "
                  f"after {r['after']} ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({"seeds": seeds, "before": before, "results": results}) + "\n")  # fmt: skip
    print()
    for line in table(results, before):
        print(line)
    print(f"equal generated-token budget per seed (rc-grpo's in its rl.steps); {SAMPLES} sampled "
          f"per task; seeds {seeds}; plot {plot(results, out / 'arena.png')}; "
          f"total {time.perf_counter() - t0:.0f} s")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=["all"], help=f"all or of {list(ARMS)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run seeds")
    parser.add_argument("--preset", default="", help="params.yaml preset on top (default: none)")
    parser.add_argument("--steps", type=int, default=0, help="RC-GRPO's RL steps (0 = preset's)")
    parser.add_argument("--out", default="outputs/bench/arena", help="results folder")
    args = parser.parse_args()
    arms = list(ARMS) if args.arms == ["all"] else args.arms
    run_arena(arms, args.seeds, args.preset, args.steps, Path(args.out))


if __name__ == "__main__":
    main()
