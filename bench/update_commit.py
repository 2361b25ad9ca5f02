"""Benchmark helper (not a test): the RL update of whatever rcgrpo is on PYTHONPATH, timed on
rollouts read from a file, so that two commits run the same update (bench/update.py --against
REF runs it under HEAD's src and under a temporary worktree of REF's, in turn).

The update is the one `bench/peer_trl.py` times for rcgrpo (its "update" column: a step's
wall clock minus its rollout): `Trainer.train_step` of the commit, with the commit's own
params.yaml `rl:` section (with, at older commits, the cpu preset; 8 tasks x G = 5,
mini-batches of 10 rollouts, micro-batches by count: --max-tokens 0, as bench/peer_trl.py sets it), on the qwen-shape
profile fully fine-tuned (its KL reference a frozen copy), so every feature the commit turns
on by default runs. The rollouts come from the file (`bench/update.py` writes them) through a
stand-in engine, scored by a fixed 0/1 pattern (every group has a spread), so only the update
differs between commits. It touches only interfaces that every commit since 007baed has:
`Trainer(policy, engine, tasks, cfg, score_fn=, temperature=)`, `train_step`,
`engine.rollout(tasks, tokens, protocol, seed, first_index=)`, `load_policy`, `RLConfig`.

Prints one JSON line: per step the update's wall seconds (perf/step_s - perf/rollout_s), its
CPU seconds (this process's; one torch thread by default) and the loss.

    PYTHONPATH=src .venv/bin/python bench/update_commit.py --rollouts FILE --steps 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


class Replay:
    """A rollout engine that returns the file's rollouts, in order, whatever it is asked."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def rollout(self, tasks, reward_tokens=None, protocol=None, seed=0, first_index=0):
        rows = self.rows[first_index : first_index + len(tasks)]
        return [
            SimpleNamespace(
                task_id=t.id,
                reward_token=tok,
                ids=r["ids"],
                mask=r["mask"],
                loss_mask=r["mask"],
                logprobs=r["logprobs"],
                stop_reason=r["stop"],
                prompt_len=r["prompt_len"],
                messages=[],
                calls=[],
                timing=None,
            )
            for t, tok, r in zip(tasks, reward_tokens, rows, strict=True)
        ]

    def sync(self, policy) -> None:  # the HF engine serves the trained model object itself
        pass


def score_fn(rows: list[dict]):
    """Each rollout's fixed reward, in the type the commit's Trainer reads."""
    by_ids = {tuple(r["ids"]): r["reward"] for r in rows}
    try:
        from rcgrpo.rollout.environment import Rewards
    except ImportError:  # before the environment seam: (paper, bfcl)
        Rewards = None

    def score(task, rollout):
        r = float(by_ids[tuple(rollout.ids)])
        return (r, r) if Rewards is None else Rewards(r, {"paper": r, "bfcl": r})

    return score


def rl_config(extra: dict):
    """The commit's RLConfig: its params.yaml `rl:` + its cpu preset's where it has one (older
    commits; params.yaml's sections are the CPU default now) + `extra` (known fields)."""
    import yaml

    from rcgrpo.runtime import project_root
    from rcgrpo.training.grpo.config import RLConfig

    params = yaml.safe_load((project_root() / "params.yaml").read_text())
    values = {
        **(params.get("rl") or {}),
        **((params.get("presets") or {}).get("cpu") or {}).get("rl", {}),
        **extra,
    }
    names = {f.name for f in dataclasses.fields(RLConfig)}
    return RLConfig(**{k: v for k, v in values.items() if k in names})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", required=True, help="JSON written by bench/update.py")
    ap.add_argument("--steps", type=int, default=2, help="update steps (same rollouts each)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--set", nargs="*", default=[], help="rl field=JSON value overrides")
    args = ap.parse_args()

    import torch

    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.runtime import apply_defaults
    from rcgrpo.training.grpo.trainer import Trainer

    apply_defaults()
    torch.set_num_threads(args.threads)
    data = json.loads(Path(args.rollouts).read_text())
    rows, group = data["rollouts"], data["group"]
    tasks = [SimpleNamespace(id=f"task_{i}") for i in range(len(rows) // group)]
    policy = load_policy(ModelConfig(profile="qwen-shape", lora=False, compact_docs=True, seed=0))
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as out:
        extra = {
            "seed": 0,
            "save_every": 0,
            "steps": args.steps,
            "out_dir": out,
            "tasks_per_step": len(tasks),
            "group_size": group,
            "max_tokens_per_micro_batch": 0,  # by count, as bench/peer_trl.py
            **{k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)},
        }
        cfg = rl_config(extra)
        trainer = Trainer(policy, Replay(rows), tasks, cfg, score_fn=score_fn(rows))
        steps = []
        for step in range(1, args.steps + 1):
            cpu = time.process_time()  # this process's CPU seconds: less noisy on a shared box
            m = trainer.train_step(step)
            steps.append(
                {
                    "update_s": m["perf/step_s"] - m["perf/rollout_s"],
                    "update_cpu_s": time.process_time() - cpu,  # the replayed rollout costs ~0
                    "loss": m["loss/total"],
                }
            )
    import rcgrpo

    shared = getattr(trainer, "shared", False)  # the commit's rl.shared_prefix, where it has one
    print(json.dumps({"steps": steps, "shared_prefix": shared, "rcgrpo": rcgrpo.__path__[0]}))


if __name__ == "__main__":
    main()
