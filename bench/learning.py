"""Benchmark: does the method learn? The paper's four variants, same start, same rollout budget.

What it measures, per seed (default 0, 1, 2), on the CPU with params.yaml's sections (the CPU default)
(exactly what `make run` trains: its dataset selection, fine-tuning and RL settings):
  1. one base model (tiny profile, seeded) and one dataset (the preset's 8 short train tasks,
     experts + 1:1 perturbation failures, built by the real dataset code, no data/ needed);
  2. plain SFT (experts, no goal) and RCTP-FT (mixed set, goals) from that same base model;
  3. the four variants of rcgrpo.evaluation.variants from those two models: SFT+GRPO, SFT+RC-GRPO,
     RCTP+GRPO (goal always <|high_reward|>), RCTP+RC-GRPO, each with the same RL steps, tasks
     per step and G: an equal rollout budget (the paper gave its GRPO baseline a smaller batch);
  4. success on the RL tasks before and after RL: combined protocol (the training one), paper
     reward, under the variant's headline goal (none for SFT starts, high for RCTP); greedy (the
     evaluation default) and sampled at temperature 1 (4 rollouts per task: the distribution RL
     optimises, which greedy hides once a policy's mode is right).
Printed per variant: reward/mean over the first and last quarter of the steps, the mean
zero-variance fraction, success before -> after RL pooled over seeds (k/n, Wilson 95 %) and per
seed; a PNG of the reward and zero-variance curves (mean over seeds); the last line is the
success of RCTP+RC-GRPO minus SFT+GRPO after RL, in points, greedy and sampled (the paper's
claim, on held-out tasks at 7B: positive).

    .venv/bin/python bench/learning.py                       # 3 seeds, ~35-45 min on 2 cores
    .venv/bin/python bench/learning.py --seeds 0 --steps 10  # a quick look
    .venv/bin/python bench/learning.py --sft-epochs 100      # SFT sees the experts as often as RCTP

The arms against each other at equal budgets, with the run as the unit: bench/arena.py.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.runtime import apply_defaults

ORDER = ("sft+grpo", "sft+rc-grpo", "rctp+grpo", "rctp+rc-grpo")


def preset_section(params: dict, preset: str, section: str, cls, extra: dict | None = None):
    """A stage config: params.yaml section + the preset's overrides + `extra`."""
    from rcgrpo.config import build

    layer = ((params.get("presets") or {}).get(preset) or {}) if preset else {}
    values = {**(params.get(section) or {}), **layer.get(section, {})}
    return build(cls, {**values, **(extra or {})}, f"params.yaml:{section} (preset {preset})")


def build_data(params: dict, preset: str, folder: Path, extra: dict | None = None):
    """The preset's train tasks (with `extra` dataset settings) and their mixed (RCTP) and
    expert (SFT) records."""
    from rcgrpo.chat.record import read_jsonl
    from rcgrpo.data.dataset import DatasetConfig, build_folder, tasks_of

    fixed = {"test_tasks": 4, "rollouts": "off", "commit": False, "push": False}
    cfg = preset_section(params, preset, "dataset", DatasetConfig, {**fixed, **(extra or {})})
    build_folder(cfg, folder, BFCL)
    rctp = folder / "rctp" / "train.jsonl"
    return (
        tasks_of(rctp, "train", BFCL),
        read_jsonl(rctp),
        read_jsonl(folder / "sft" / "train.jsonl"),
    )


def fine_tune(mode: str, records, params, preset, seed: int, out: Path, epochs: int = 0):
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.training.sft import render_examples, train_sft
    from rcgrpo.training.sft_config import SFTConfig

    policy = load_policy(ModelConfig(seed=seed))  # the same base weights for both modes
    extra = {"seed": seed, "out_dir": str(out)} | ({"epochs": epochs} if epochs else {})
    cfg = preset_section(params, preset, mode, SFTConfig, extra)
    history = train_sft(policy.model, render_examples(policy, records, cfg, BFCL), cfg,
                        pad_id=policy.tokenizer.pad_token_id or 0)  # fmt: skip
    return policy, history[-1]["sft/loss"]


SAMPLES = 4  # sampled rollouts per task (temperature 1): the policy RL optimises, not its mode


def success(policy, rollout_cfg, tasks, token: str, out: Path) -> dict:
    """{"greedy": (k, n), "sampled": (k, n)}: paper-reward successes on `tasks` under `token`,
    combined protocol; greedy (the evaluation default) and SAMPLES seeds at temperature 1."""
    from dataclasses import replace

    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import evaluate
    from rcgrpo.rollout.execution import make_engine

    counts = {}
    for name, temperature, seeds in (("greedy", 0.0, (0,)), ("sampled", 1.0, range(SAMPLES))):
        engine = make_engine(replace(rollout_cfg, temperature=temperature), policy, BFCL)
        cfg = EvalConfig(split="train", protocol="combined", other_protocol=False,
                         temperature=temperature, tokens=(token,), seeds=tuple(seeds),
                         out_dir=str(out / name))  # fmt: skip
        by_seed = evaluate(engine, cfg, tasks=tasks, environment=BFCL)["runs"][token]
        k = sum(s["paper"]["pooled"]["k"] for s in by_seed.values())
        n = sum(s["paper"]["pooled"]["n"] for s in by_seed.values())
        counts[name] = (int(k), int(n))
    return counts


def run_variant(name, start, tasks, params, preset, seed, rollout_cfg, steps, out: Path) -> dict:
    from rcgrpo.evaluation.variants import get_variant
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    v = get_variant(name)
    policy = copy.deepcopy(start)  # every variant of an init starts from the same weights
    extra = {**v.rl_overrides(), "seed": seed, "save_every": 0, "out_dir": str(out / "rl")}
    if steps:
        extra["steps"] = steps
    cfg = preset_section(params, preset, "rl", RLConfig, extra)
    token = v.eval_tokens[0]
    before = success(policy, rollout_cfg, tasks, token, out / "before")
    engine = make_engine(rollout_cfg, policy, BFCL)
    history = Trainer(
        policy, engine, tasks, cfg, BFCL.scorer(cfg.protocol), temperature=rollout_cfg.temperature
    ).train()
    after = success(policy, rollout_cfg, tasks, token, out / "after")
    return {
        "token": token,
        "before": before,
        "after": after,
        "reward": [m["reward/mean"] for m in history],
        "zero_variance": [m["rollout/zero_variance_frac"] for m in history],
        "rollouts": sum(cfg.tasks_per_step * cfg.group_size for _ in history),
    }


def plot(results: dict, path: Path) -> Path:
    from rcgrpo.evaluation.plots import pyplot, save

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for name in ORDER:
        runs = results[name]
        for ax, key in zip(axes, ("reward", "zero_variance"), strict=True):
            curves = [r[key] for r in runs]
            mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(curves[0]))]
            ax.plot(range(1, len(mean) + 1), mean, marker="o", ms=3, label=name)
    axes[0].set(title="reward/mean (mean over seeds)", xlabel="RL step", ylabel="reward")
    axes[1].set(title="rollout/zero_variance_frac (mean over seeds)", xlabel="RL step",
                ylabel="fraction of groups", ylim=(-0.05, 1.05))  # fmt: skip
    return save(fig, axes, path)


def fmt(k: int, n: int) -> str:
    from rcgrpo.evaluation.stats import wilson

    lo, hi = wilson(k, n)
    return f"{k:2d}/{n} = {100 * k / n:5.1f}% [{100 * lo:4.1f}, {100 * hi:5.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run seeds")
    parser.add_argument("--preset", default="", help="params.yaml preset on top (default: none)")
    parser.add_argument("--steps", type=int, default=0, help="RL steps (0 = the preset's)")
    parser.add_argument("--sft-epochs", type=int, default=0,
                        help="plain SFT epochs (0 = the preset's: 2/5 of RCTP-FT's, as the paper)")  # fmt: skip
    parser.add_argument("--out", default="outputs/bench/learning", help="results folder")
    args = parser.parse_args()
    apply_defaults()
    import torch

    from rcgrpo.config import read_params
    from rcgrpo.rollout.config import RolloutConfig

    params, t0, out = read_params(), time.perf_counter(), Path(args.out)
    rollout_cfg = preset_section(params, args.preset, "rollout", RolloutConfig)
    results: dict = {name: [] for name in ORDER}
    with tempfile.TemporaryDirectory() as tmp:
        tasks, mixed, experts = build_data(params, args.preset, Path(tmp) / "data")
    print(f"RL tasks ({len(tasks)}): {[t.id for t in tasks]}; threads {torch.get_num_threads()}")
    for seed in args.seeds:
        starts = {}
        for mode, records in (("sft", experts), ("rctp", mixed)):
            epochs = args.sft_epochs if mode == "sft" else 0
            starts[mode], loss = fine_tune(mode, records, params, args.preset, seed, out, epochs)
            print(f"seed {seed}: {mode} fine-tuned, final loss {loss:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
        for name in ORDER:
            r = run_variant(name, starts[name.split("+")[0]], tasks, params, args.preset, seed,
                            rollout_cfg, args.steps, out / f"s{seed}" / name)  # fmt: skip
            results[name].append(r)
            b, a = r["before"], r["after"]
            print(f"seed {seed}: {name:13s} greedy {b['greedy'][0]}/{b['greedy'][1]} -> "
                  f"{a['greedy'][0]}/{a['greedy'][1]}, sampled {b['sampled'][0]}/{b['sampled'][1]}"
                  f" -> {a['sampled'][0]}/{a['sampled'][1]} ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({"args": vars(args), "results": results}) + "\n")

    print(f"\n{'variant':13s} {'goal':5s} {'reward first->last quarter':>27s} {'zero-var':>8s}  "
          f"success before -> after RL, pooled over seeds, Wilson 95 %   per seed after")  # fmt: skip
    after = {}
    for name in ORDER:
        runs = results[name]
        n_steps = len(runs[0]["reward"])
        q = max(1, n_steps // 4)
        first = sum(sum(r["reward"][:q]) / q for r in runs) / len(runs)
        last = sum(sum(r["reward"][-q:]) / q for r in runs) / len(runs)
        zv = sum(sum(r["zero_variance"]) / n_steps for r in runs) / len(runs)
        for mode in ("greedy", "sampled"):
            kb, nb = (sum(r["before"][mode][i] for r in runs) for i in (0, 1))
            ka, na = (sum(r["after"][mode][i] for r in runs) for i in (0, 1))
            after[name, mode] = (ka, na)
            per_seed = " ".join(f"{r['after'][mode][0]}/{r['after'][mode][1]}" for r in runs)
            head = (f"{name:13s} {runs[0]['token']:5s} {first:13.3f} -> {last:.3f}      {zv:8.3f}"
                    if mode == "greedy" else " " * 56)  # fmt: skip
            print(f"{head}  {mode:7s} {fmt(kb, nb)} -> {fmt(ka, na)}  {per_seed}")
    budget = results[ORDER[0]][0]["rollouts"]
    print(f"equal rollout budget: {budget} rollouts per run; seeds {args.seeds}; "
          f"plot {plot(results, out / 'learning.png')}; total {time.perf_counter() - t0:.0f} s")  # fmt: skip
    diffs = []
    for mode in ("greedy", "sampled"):
        (ka, na), (kb, nb) = after["rctp+rc-grpo", mode], after["sft+grpo", mode]
        diffs.append(f"{100 * (ka / na - kb / nb):+.1f} points {mode} (n = {na} each)")
    print("RCTP+RC-GRPO minus SFT+GRPO, success on the RL tasks after RL: " + ", ".join(diffs))


if __name__ == "__main__":
    main()
