"""What every arm of the arena shares: the task pool, the held-out sets, the cached fine-tuned
starts, and the evaluation at a budget point (bench/arena.py runs the arms).

- The pool: the `--tasks N` short base train tasks (<= 3 gold calls; all 26 by default), built
  into experts + 1:1 perturbation failures by the real dataset code (the CPU default's settings).
- Held-out values: `VARIANTS` value variants of each pool task (rcgrpo.bfcl.value_variants:
  the same scenario, literals the model must copy replaced by fresh ones), never trained on.
- Unseen scenarios (a floor): the base test tasks with <= 4 gold calls.
- Starts: RCTP-FT from the base model with seed k on the pool's mixed set, built once and kept in
  `--cache` (cache/arena/starts)/<key>/ where the key hashes everything that makes them (pool ids, the
  resolved dataset / fine-tuning / model sections, k, the fine-tuning code as checked out); a run
  records the key and the weights' md5, so the input of every arm-run is versioned.

    .venv/bin/python bench/arena.py --pilot          # the start's held-out-value success
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import tempfile
from pathlib import Path

from learning import build_data, fine_tune, preset_section

from rcgrpo.envs.bfcl.environment import BFCL

VARIANTS = 4  # held-out value variants per pool task
VARIANT_SEED = 7  # their values' draw (train values are BFCL's own)
UNSEEN_MAX_CALLS = 4
SETS = ("in_sample", "heldout_values", "unseen")


def pool_and_data(params: dict, preset: str, n_tasks: int, extra: dict):
    """The pool's tasks and mixed (RCTP) records, built in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        tasks, mixed, _ = build_data(
            params, preset, Path(tmp) / "data", {"train_tasks": n_tasks, **extra}
        )
    return tasks, mixed


def heldout_sets(pool: list) -> dict[str, list]:
    """{"in_sample": pool, "heldout_values": variants of the pool, "unseen": short test tasks}."""
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.bfcl.value_variants import variants

    held = [v for t in pool for v in variants(t, VARIANTS, VARIANT_SEED)]
    unseen = [t for t in tasks_in("test", ("base",)) if sum(map(len, t.ground_truth)) <= UNSEEN_MAX_CALLS]  # fmt: skip
    return {"in_sample": list(pool), "heldout_values": held, "unseen": unseen}


# the code a start depends on: src/ but the stages after fine-tuning
CODE = ["src", *(f":!src/rcgrpo/{p}" for p in ("evaluation", "tracking", "cli", "training/grpo", "training/plan"))]  # fmt: skip


def code_version() -> str:
    """A hash of that code as it is in the checkout: HEAD's blobs plus the uncommitted diff."""

    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout

    text = git("ls-files", "-s", "--", *CODE) + git("diff", "HEAD", "--", *CODE)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def start_key(params: dict, preset: str, pool: list, k: int) -> str:
    from rcgrpo.data.dataset import DatasetConfig
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.training.sft_config import SFTConfig

    parts = {
        "pool": [t.id for t in pool],
        "dataset": dataclasses.asdict(preset_section(params, preset, "dataset", DatasetConfig)),
        "rctp": dataclasses.asdict(preset_section(params, preset, "rctp", SFTConfig)),
        "model": dataclasses.asdict(ModelConfig(seed=k)),
        "start": k,
        "code": code_version(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def weights_md5(folder: Path) -> str:
    h = hashlib.md5()
    for f in sorted(folder.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def start(params, preset, pool, mixed, k: int, cache: Path, log=print):
    """Start k: (policy, {"key", "md5", "path", "built"}); loaded from `cache` when there."""
    from rcgrpo.models.loading import load_policy, save_policy
    from rcgrpo.models.profiles import ModelConfig

    key = start_key(params, preset, pool, k)
    folder = Path(cache) / key
    if (folder / "done").exists():
        policy = load_policy(ModelConfig(seed=k), adapter_path=folder / "policy")
        built = False
    else:
        policy, loss = fine_tune("rctp", mixed, params, preset, k, folder / "train")
        save_policy(policy, folder / "policy", {"stage": "rctp", "protocol": "combined"})
        (folder / "done").write_text(json.dumps({"loss": loss, "pool": [t.id for t in pool]}))
        log(f"start {k}: built RCTP-FT, loss {loss:.4f}, cached in {folder}")
        built = True
    info = {"key": key, "md5": weights_md5(folder / "policy"), "path": str(folder), "built": built}
    return policy, info


def evaluate_sets(
    policy, rollout_cfg, sets: dict, token: str, out: Path, modes=("greedy",)
) -> dict:
    """{set: {mode: (k, n)}} and {set: {mode: {task id: success rate}}}: one batched evaluation
    of every set's tasks under `token` (combined protocol, paper reward); greedy, and
    `sampled` = SAMPLES rollouts per task at T = 1."""
    from dataclasses import replace

    from learning import SAMPLES

    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import evaluate
    from rcgrpo.rollout.execution import make_engine

    every = [t for tasks in sets.values() for t in tasks]
    side = {t.id: name for name, tasks in sets.items() for t in tasks}
    counts: dict = {name: {} for name in sets}
    per_task: dict = {name: {} for name in sets}
    for mode in modes:
        temperature, seeds = (0.0, (0,)) if mode == "greedy" else (1.0, tuple(range(SAMPLES)))
        engine = make_engine(replace(rollout_cfg, temperature=temperature), policy, BFCL)
        cfg = EvalConfig(split="train", protocol="combined", other_protocol=False,
                         temperature=temperature, tokens=(token,), seeds=seeds,
                         out_dir=str(out / mode))  # fmt: skip
        evaluate(engine, cfg, tasks=every, environment=BFCL)
        rates: dict = {}
        for line in (out / mode / "outcomes.jsonl").read_text().splitlines():
            o = json.loads(line)
            rates.setdefault(o["task_id"], []).append(int(o["paper"]))
        for name in sets:
            mine = {t: v for t, v in rates.items() if side[t] == name}
            counts[name][mode] = (sum(map(sum, mine.values())), sum(map(len, mine.values())))
            per_task[name][mode] = {t: sum(v) / len(v) for t, v in mine.items()}
    return {"counts": counts, "per_task": per_task}
