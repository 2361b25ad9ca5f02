"""The arena's table and statistics, computed from its MLflow runs alone (bench/arena.py).

PLAN is the analysis, fixed before the run and logged with every arm-run (analysis_plan.json):
one primary comparison on one metric, the training run as the unit (a paired t-test over the
(start, seed) pairs, rcgrpo.evaluation.seed_stats), Holm's correction over the named
secondaries, and the power of the primary test at the spread the runs showed.

    .venv/bin/python bench/arena.py report            # the last arena in the store
    .venv/bin/python bench/arena.py report --id ID    # one arena (its runs' tag arena.id)
"""

from __future__ import annotations

import math

# The pilot (docs/benchmarks.md) decided: a start's held-out-value success was 0/80 greedy,
# 0/320 sampled, outside 15-60 %, so the primary metric is success on the pool, sampled
PRIMARY = "arena/in_sample/sampled"
PLAN = {
    "unit": "one arm-run = one RL seed from one fine-tuned start; arms paired by (start, seed)",
    "primary": {
        "comparison": ["rc-grpo", "grpo"],
        "metric": f"{PRIMARY} (4 rollouts per pool task, T = 1, high goal) at the last budget point",
        "test": "paired t over the (start, seed) pairs, two-sided, alpha 0.05",
    },
    "secondaries": {
        "auc": "rc-grpo - grpo: the primary metric's mean over the budget points (area)",
        "tokens_to_threshold": "rc-grpo - grpo: sampled tokens until the 3-step moving mean of "
        "reward/mean_high first reaches THRESHOLD (never: the run's total, censored)",
        "gap": "rc-grpo - grpo: in-sample greedy success high goal minus low goal, last point",
        "sign": "grpo+sign - rc-grpo: the primary metric",
        "presample": "grpo+presample - rc-grpo: the primary metric",
    },
    "correction": "Holm over the secondaries present",
    "power": "of the primary test at the observed sd of its paired differences, effect 0.10",
    "threshold": 0.35,  # the pilot start's sampled in-sample success (0.20) + 0.15
}
SECONDARY_ARMS = {"sign": ("grpo+sign", "rc-grpo"), "presample": ("grpo+presample", "rc-grpo")}
MECHANISM = (
    "rollout/zero_variance_all_fail_frac",
    "rollout/zero_variance_all_success_frac",
    "reward/goal_variance_share",
    "reward/token_gap",
)


def load(arena_id: str = "") -> tuple[str, str, list[dict]]:
    """(arena id, experiment id, runs) from the `arena` experiment of the tracking store: per
    run its tags, last metric values, per-point and per-step histories."""
    from mlflow.tracking import MlflowClient

    from rcgrpo.tracking import runs as tracking

    exp_id = tracking.configure(experiment="arena")
    client = MlflowClient()
    found = client.search_runs([exp_id], order_by=["attributes.start_time DESC"], max_results=5000)
    if not found:
        raise SystemExit(f"error: no arena run in {tracking.tracking_uri()}")
    arena_id = arena_id or found[0].data.tags.get("arena.id", "")
    runs = []
    for r in found:
        if r.data.tags.get("arena.id") != arena_id or r.info.status != "FINISHED":
            continue

        def history(key, run_id=r.info.run_id):
            return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]  # fmt: skip

        runs.append({
            "arm": r.data.tags["arm"], "start": int(r.data.tags["start"]),
            "seed": int(r.data.tags["seed"]), "metrics": r.data.metrics,
            "points": {k: history(k) for k in (PRIMARY, "arena/point_budget", "arena/point_tokens")},  # fmt: skip
            "steps": {k: history(k) for k in ("reward/mean_high", "rollout/generated_tokens_total", *MECHANISM)},  # fmt: skip
        })  # fmt: skip
    if not runs:
        raise SystemExit(f"error: arena {arena_id!r} has no finished run")
    return arena_id, exp_id, runs


def per_run(run: dict) -> dict:
    """The numbers the statistics compare, for one run."""
    from rcgrpo.evaluation.seed_stats import auc, moving_mean, tokens_to

    m, pts = run["metrics"], run["points"]
    budgets, values = pts["arena/point_budget"], pts[PRIMARY]
    tokens = run["steps"]["rollout/generated_tokens_total"]
    high = run["steps"]["reward/mean_high"]
    reach = tokens_to(tokens, moving_mean(high, 3), PLAN["threshold"]) if len(high) == len(tokens) and high else None  # fmt: skip
    return {
        "primary": m.get(PRIMARY, math.nan),
        "auc": auc(budgets, values)
        if len(budgets) >= 3 and len(values) == len(budgets)
        else math.nan,  # fmt: skip
        "tokens_to_threshold": reach if reach is not None else (tokens[-1] if tokens else math.nan),
        "gap": m.get("arena/in_sample/greedy", math.nan)
        - m.get("arena/in_sample/greedy_low", math.nan),  # fmt: skip
    }


def pairs(runs: list[dict], a: str, b: str, key: str) -> tuple[list[float], list[float]]:
    """Arm a's and arm b's `key` over the (start, seed) units both ran, in the same order."""
    by = {(r["arm"], r["start"], r["seed"]): per_run(r)[key] for r in runs}
    units = sorted({(s, d) for (arm, s, d) in by if arm == a} & {(s, d) for (arm, s, d) in by if arm == b})  # fmt: skip
    keep = [u for u in units if not (math.isnan(by[(a, *u)]) or math.isnan(by[(b, *u)]))]
    return [by[(a, *u)] for u in keep], [by[(b, *u)] for u in keep]


def mean_sd(xs: list[float]) -> str:
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return "-"
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return f"{m:.3f} ± {sd:.3f}"


def arm_table(runs: list[dict]) -> list[str]:
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    cols = ("arena/steps", "arena/generated_tokens", "arena/prompt_tokens", "arena/prefill_tokens", "arena/update_tokens", "arena/optimizer_steps", "arena/wall_s")  # fmt: skip
    lines = ["| arm | runs | steps | generated | prompt | prefill | update tokens | opt steps | wall s | tokens at last point / budget |",  # fmt: skip
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        avg = [sum(r["metrics"].get(c, 0.0) for r in mine) / len(mine) for c in cols]
        ratio = [r["points"]["arena/point_tokens"][-1] / r["points"]["arena/point_budget"][-1] for r in mine if r["points"]["arena/point_budget"]]  # fmt: skip
        share = f"{min(ratio):.3f}-{max(ratio):.3f}" if ratio else "- (no budget)"
        lines.append(f"| {arm} | {len(mine)} | {avg[0]:.1f} | {avg[1]:,.0f} | {avg[2]:,.0f} | {avg[3]:,.0f} | {avg[4]:,.0f} | {avg[5]:.1f} | {avg[6]:.0f} | {share} |")  # fmt: skip
    lines += ["", "| arm | in-sample sampled (primary) | in-sample greedy | held-out values greedy | unseen greedy | AUC (primary) | tokens to threshold | gap high-low | all-fail / all-success groups | goal variance share | token gap |",  # fmt: skip
              "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        got = [per_run(r) for r in mine]

        def last(key, mine=mine):
            return mean_sd([r["metrics"].get(key, math.nan) for r in mine])

        def over_steps(key, mine=mine):
            vals = [sum(v) / len(v) for r in mine if (v := r["steps"].get(key))]
            return f"{sum(vals) / len(vals):.3f}" if vals else "-"

        lines.append(
            f"| {arm} | {last(PRIMARY)} | {last('arena/in_sample/greedy')} | {last('arena/heldout_values/greedy')} | {last('arena/unseen/greedy')} "  # fmt: skip
            f"| {mean_sd([g['auc'] for g in got])} | {mean_sd([g['tokens_to_threshold'] for g in got])} "  # fmt: skip
            f"| {mean_sd([g['gap'] for g in got])} | {over_steps(MECHANISM[0])} / {over_steps(MECHANISM[1])} | {over_steps(MECHANISM[2])} | {over_steps(MECHANISM[3])} |"  # fmt: skip
        )
    return lines


def statistics(runs: list[dict]) -> list[str]:
    from rcgrpo.evaluation.seed_stats import holm, paired_t, power_paired_t

    def test(a, b, key):
        x, y = pairs(runs, a, b, key)
        return paired_t(x, y) if len(x) >= 2 else None

    lines = []
    primary = test("rc-grpo", "grpo", "primary")
    if primary is not None:
        power = power_paired_t(0.10, primary.sd, primary.n)
        lines.append(f"primary (planned): rc-grpo - grpo, {PLAN['primary']['metric']}: "
                     f"{primary.mean:+.3f} [{primary.low:+.3f}, {primary.high:+.3f}], t({primary.n - 1}) = "
                     f"{primary.t:.2f}, p = {primary.p:.3f}; sd of the differences {primary.sd:.3f}, "
                     f"power for a 0.10 effect at it: {power:.2f}")  # fmt: skip
    tests = {}
    for name in PLAN["secondaries"]:
        a, b = SECONDARY_ARMS.get(name, ("rc-grpo", "grpo"))
        key = "primary" if name in SECONDARY_ARMS else name
        if (r := test(a, b, key)) is not None:
            tests[name] = (a, b, r)
    adjusted = holm({k: r.p for k, (_, _, r) in tests.items()})
    for name, (a, b, r) in tests.items():
        lines.append(f"secondary {name}: {a} - {b}: {r.mean:+.3f} [{r.low:+.3f}, {r.high:+.3f}], "
                     f"n = {r.n}, p = {r.p:.3f}, Holm p = {adjusted[name]:.3f}")  # fmt: skip
    starts = sorted({r["start"] for r in runs})
    lines.append(f"intervals: 95 % t intervals over the paired (start, seed) units; they cover the "
                 f"mean difference over RL seeds from these {len(starts)} fine-tuned start(s) on "
                 f"this pool, not other starts, models or tasks")  # fmt: skip
    return lines


def report(arena_id: str = "") -> str:
    """The arena's tables and statistics, from the MLflow store alone."""
    arena_id, exp_id, runs = load(arena_id)
    head = f"arena {arena_id} (MLflow experiment `arena`, id {exp_id}): {len(runs)} arm-runs"
    return "\n".join([head, "", *arm_table(runs), "", *statistics(runs)])
