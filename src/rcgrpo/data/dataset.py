"""The dataset stage's config and the pure parts of a build: pick tasks, assemble, write files.

`flows/build_dataset.py` runs these as Prefect tasks (experts -> failures -> label -> validate ->
version); the functions here know nothing about Prefect, DVC or GX. Output (one folder, later
swapped into `data/` whole):

    rctp/{train,test}.jsonl   labelled mixed set (experts high + failures low, 1:1 by default)
    sft/{train,test}.jsonl    experts, no reward goal (plain SFT baseline)
    manifest.json             config, counts per split/label/generator, experts that failed,
                              rollouts tried / kept / refused by reason, the model rolled out and
                              the engine and budgets it ran with, and per split how many low rows
                              are the policy's own failures and how many are perturbations

Builds are deterministic: the same config gives the same bytes (and so the same DVC md5), which is
why Provenance.created_at stays empty; a build's date is the git commit of data.dvc.

    rcgrpo data build --set train_tasks=8 --set test_tasks=4
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from rcgrpo.chat.record import SPLITS, Trajectory, write_jsonl
from rcgrpo.data.failures import RolloutReport
from rcgrpo.fields import config_class, ranged, setting
from rcgrpo.rollout.environment import Environment


@config_class
class DatasetConfig:
    """params.yaml `dataset:` section."""

    root: str = setting("", 'project (git + DVC repo) root; "" = this checkout')
    data_dir: str = setting("data", "the DVC-tracked folder, relative to root")
    remote: str = setting("dvc_remote", "local DVC remote folder (relative to root or absolute)")
    docs_dir: str = setting("reports/data_docs", "Great Expectations Data Docs (outside data/)")
    protocol: Literal["combined", "bfcl"] = setting(
        "combined", "prompt protocol of every trajectory (combined: the paper's training prompt)"
    )
    categories: tuple[str, ...] = setting(
        (), "the environment's task categories to include ([] = all; BFCL: base, miss_func, ...)"
    )
    train_tasks: int = ranged(
        0,
        "[0, inf)",
        "train tasks to use (0 = all; BFCL: 720); a seeded, category-stratified subset",
    )
    test_tasks: int = ranged(0, "[0, inf)", "test tasks to use (0 = all; BFCL: 80)")
    train_categories: tuple[str, ...] = setting(
        (), "categories the train tasks may come from ([] = categories; test is never filtered)"
    )
    train_max_calls: int = ranged(
        0, "[0, inf)", "only train tasks whose ground truth has at most this many calls (0 = any)"
    )
    low_per_high: float = ranged(1.0, "(0, inf)", "failures per expert in the mixed set (1:1)")
    balance_tolerance: float = ranged(
        0.05, "[0, 1]", "|high share - target| allowed by the validation suite"
    )
    kinds: tuple[str, ...] = setting(
        ("all",),
        "the environment's failure kinds (source b): [all] = every kind it has, [] = none "
        "(own-policy rollouts only); BFCL: wrong_tool, ...",
    )
    attempts: int = ranged(4, "[1, inf)", "candidate perturbations tried per kind until one fails")
    # YAML reads a bare on/off as a bool: accepted
    rollouts: Literal["auto", "on", "off"] | bool = setting(
        "auto", "failure source (a), base-policy rollouts: auto = on if the engine loads"
    )
    rollout_profile: str = setting(
        "",
        'base policy rolled out: "" = the `model:` section (the policy\'s own failures); '
        "a profile name = that profile",
    )
    rollout_share: float = ranged(
        0.5, "[0, 1]", "most of the failures taken from rollouts (the rest: perturbations)"
    )
    vllm_servers: int = ranged(
        0, "[0, inf)", "vllm: this stage's servers (0 = one per visible GPU; CPU: rollout's)"
    )
    vllm_gpu_memory_utilization: float = ranged(
        0.85, "(0, 1]", "vllm: share of each GPU for this stage's servers (no trainer beside)"
    )
    commit: bool = setting(True, "git-commit data.dvc after a valid build")
    push: bool = setting(True, "dvc push to the remote after the commit")
    lock_timeout_s: float = ranged(600.0, "[0, inf)", "wait at most this long for another build")
    seed: int = ranged(0, "[0, inf)", "task subset, perturbations, failure draw, row order")

    def __post_init__(self):
        if isinstance(self.rollouts, bool):
            object.__setattr__(self, "rollouts", "on" if self.rollouts else "off")

    @property
    def project(self) -> Path:
        from rcgrpo.runtime import project_root

        return Path(self.root).resolve() if self.root else project_root()

    @property
    def data_path(self) -> Path:
        return self.project / self.data_dir

    @property
    def high_share(self) -> float:
        """Target fraction of high rows in a mixed split (0.5 at 1:1)."""
        return 1.0 / (1.0 + self.low_per_high)


def load_config(overrides: dict | None = None, path: Path | None = None) -> DatasetConfig:
    from rcgrpo.config import load_section

    return load_section("dataset", DatasetConfig, path=path, overrides=overrides)


def rollout_model(
    cfg: DatasetConfig, model_overrides: dict | None = None, path: Path | None = None, model=None
):
    """The ModelConfig whose base policy `rollout_failures` rolls out (resolved at build time).

    rollout_profile "" (or model.profile itself): `model` (a resolved run's), else params.yaml
    `model:` (file `path`, default the checkout's) with `model_overrides` on top, unchanged. Another profile name: that profile with
    model's seed, dtype and device, its own defaults otherwise (model.path belongs to model.profile).
    """
    from rcgrpo.config import load_section
    from rcgrpo.models.profiles import (
        ModelConfig,  # light: transformers is imported inside its functions
    )

    if model is None:
        model = load_section("model", ModelConfig, path=path, overrides=model_overrides)
    if not cfg.rollout_profile or cfg.rollout_profile == model.profile:
        return model
    return ModelConfig(
        profile=cfg.rollout_profile, seed=model.seed, dtype=model.dtype, device=model.device
    )


def select_tasks(cfg: DatasetConfig, split: str, env: Environment) -> list:
    """The split's tasks of `env`, or a seeded subset stratified round-robin over categories.
    Train tasks are first narrowed to `train_categories` and to at most `train_max_calls`
    ground-truth calls."""
    categories, field = tuple(cfg.categories) or tuple(env.categories), "categories"
    if split == "train" and cfg.train_categories:
        categories, field = tuple(cfg.train_categories), "train_categories"
    try:
        tasks = env.tasks(split, categories)
    except ValueError as e:  # a category the environment does not have
        raise ValueError(f"dataset.{field}={list(categories)}: {e}") from None
    if split == "train" and cfg.train_max_calls:
        tasks = [t for t in tasks if sum(map(len, t.ground_truth)) <= cfg.train_max_calls]
        if not tasks:
            raise ValueError(
                f"dataset.train_max_calls={cfg.train_max_calls}: no train task of {categories} "
                "has so few ground-truth calls (the shortest have 2)"
            )
    n = cfg.train_tasks if split == "train" else cfg.test_tasks
    if not n or n >= len(tasks):
        return tasks
    rng = random.Random(f"{cfg.seed}:{split}")
    by_cat = {
        c: rng.sample([t for t in tasks if t.category == c], k=sum(t.category == c for t in tasks))
        for c in categories
    }
    picked: list = []
    while len(picked) < n:
        for c in categories:
            if by_cat[c] and len(picked) < n:
                picked.append(by_cat[c].pop())
    order = {t.id: i for i, t in enumerate(tasks)}  # within a category: BFCL's task number
    return sorted(picked, key=lambda t: (t.category, order[t.id]))


def tasks_of(path: str | Path, split: str, env: Environment) -> list:
    """The tasks of `env` a dataset file (Trajectory JSONL) was built from, in the
    environment's order: the RL and the train-task evaluation use the tasks the policy was
    fine-tuned on. A task of the other split in the file is an error (RL or a "train" score on
    test tasks is a leak)."""
    from rcgrpo.chat.record import read_jsonl

    ids = {r.task_id for r in read_jsonl(path)}
    if not ids:
        raise ValueError(f"{path} holds no trajectory: no task to train or evaluate on")
    tasks = [t for t in env.tasks(split) if t.id in ids]
    if stray := sorted(ids - {t.id for t in tasks}):
        raise ValueError(f"{path}: tasks {stray[:5]} are not {split} tasks of {env.name}")
    return tasks


def low_sources(rows: list[Trajectory]) -> dict:
    """Where the low rows of a mixed file come from: the policy's own rollouts or perturbations."""
    low = [r.provenance.generator for r in rows if r.reward != 1]
    return {
        "policy_rollouts": sum(g == "rollout" for g in low),
        "perturbations": sum(g.startswith("perturbation:") for g in low),
    }


def counts(rows: list[Trajectory]) -> dict:
    """{"high": n, "low": n, "generators": {...}} of one file."""
    labels = Counter("high" if r.reward == 1 else "low" for r in rows)
    return {
        "rows": len(rows),
        "high": labels["high"],
        "low": labels["low"],
        "generators": dict(sorted(Counter(r.provenance.generator for r in rows).items())),
    }


def write_dataset(
    out: Path,
    rctp: dict[str, list],
    sft: dict[str, list],
    cfg: DatasetConfig,
    expert_failures,
    rollouts: dict | None = None,
) -> dict:
    """Write every file of one build into `out` and return the manifest. rollouts: the
    RolloutReport summary (None: no rollout was tried). config.rollout_profile is the profile
    actually rolled out when there was one, so "" never hides which policy failed."""
    files = {}
    for split in SPLITS:
        for name, sets in (("rctp", rctp), ("sft", sft)):
            rel = f"{name}/{split}.jsonl"
            write_jsonl(out / rel, sets[split])
            files[rel] = counts(sets[split])
    rollouts = rollouts or RolloutReport().summary()
    config = {
        k: v
        for k, v in asdict(cfg).items()
        if k not in ("root", "lock_timeout_s", "commit", "push")
    }
    if rollouts.get("model"):
        config["rollout_profile"] = rollouts["model"]["profile"]
    manifest = {
        "config": config,
        "files": files,
        "expert_failures": expert_failures,  # ground truths that did not score 1, by task id
        "rollouts": rollouts,  # tried == kept + sum(refused): failures.refusal's reasons
        "low_half": {split: low_sources(rctp[split]) for split in SPLITS},
    }
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True, default=list) + "\n")
    tmp.replace(out / "manifest.json")
    return manifest


def build_folder(
    cfg: DatasetConfig, out: Path, env: Environment, rollouts: dict | None = None
) -> dict:
    """The flow's generate -> label -> write stages as plain Python (no Prefect), for tests and
    notebooks: writes one build of `env`'s tasks into `out` and returns its manifest. rollouts:
    split -> records (made elsewhere, e.g. by rollout_failures); only those `failures.refusal`
    accepts are used."""
    from rcgrpo.data.generate import generate_experts, generate_failures
    from rcgrpo.data.labels import low_half, mixed_set, sft_set

    screened = RolloutReport()
    usable = {s: [r for r in (rollouts or {}).get(s, []) if screened.add(r)] for s in SPLITS}
    rctp, sft, failed = {}, {}, []
    for split in SPLITS:
        tasks = select_tasks(cfg, split, env)
        report = generate_experts(env, tasks, split, cfg.protocol)
        perturbed = generate_failures(
            env, tasks, split, cfg.protocol, cfg.seed, cfg.kinds, cfg.attempts
        )
        n_low = round(len(report.experts) * cfg.low_per_high)
        lows = low_half(usable[split], perturbed, n_low, cfg.rollout_share, cfg.seed)
        rctp[split], sft[split] = mixed_set(report.experts, lows, cfg.seed), sft_set(report.experts)
        failed += report.failed
    return write_dataset(
        Path(out), rctp, sft, cfg, failed, screened.summary() if rollouts else None
    )
