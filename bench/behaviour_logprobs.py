"""Benchmark (not a test): the RL update time `rl.behaviour_logprobs: engine` saves by skipping
the pi_old forward, against `recompute`, in the same run.

What: two Trainers on the same model profile from the same initial weights, one per setting,
train on the SAME rollouts (sampled once by the HF engine, then handed back every step by a
replaying engine, so no step pays for generation and both update on identical batches). Their
RL steps alternate (recompute, engine, then engine, recompute, ...: drift in the shared box's
load hits both); the first step of each is a warm-up and not counted. Update time = the step's
`perf/step_s - perf/rollout_s`: pi_old (recompute only) and reference forwards, the PPO passes,
the metrics. With `engine` the pi_old forward is skipped; the reference forward stays unless
--kl-coef 0. Expected saving: one no-grad forward of (pi_old + reference forwards + one
forward-and-backward ~ 3 forwards), i.e. ~1/5 with the KL, ~1/4 without.

Printed: threads and load; each setting's update seconds per counted step and their median;
last line: `engine/recompute update time: X` (median of the per-step ratios; below 1 = saved).

    .venv/bin/python bench/behaviour_logprobs.py --profile tiny --steps 2     # quick (~1 min)
    .venv/bin/python bench/behaviour_logprobs.py                              # qwen-shape
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


class Replay:
    """The rollout engine interface over rollouts recorded once: every step gets the same ones
    (their engine log-probs are those of the initial weights; the timing does not depend on it)."""

    logprobs_temperature = 1.0  # the HF engine's, which recorded them

    def __init__(self, recorded):
        self.recorded = recorded

    def rollout(self, tasks, reward_tokens, protocol, seed, first_index=0):
        return self.recorded[first_index : first_index + len(tasks)]

    def sync(self, policy) -> None:
        """Nothing to serve: the rollouts are recorded."""


def main() -> None:
    from rcgrpo.envs.bfcl.environment import BFCL

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="qwen-shape", help="model profile (tiny: quick)")
    parser.add_argument("--steps", type=int, default=4, help="counted RL steps per setting")
    parser.add_argument("--tasks", type=int, default=2, help="RL tasks per step")
    parser.add_argument("--group", type=int, default=4, help="rollouts per task, G")
    parser.add_argument("--micro", type=int, default=4, help="rollouts per forward pass")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens per message")
    parser.add_argument("--kl-coef", type=float, default=0.1, help="0: no reference forward")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    args = parser.parse_args()

    from rcgrpo.runtime import apply_defaults, torch_thread_count

    apply_defaults()
    import torch

    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import HIGH, LOW
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    threads = torch_thread_count(args.threads)
    torch.set_num_threads(threads)
    print(f"profile {args.profile}; threads {threads}; load {os.getloadavg()}")
    tasks = [t for t in tasks_in("train") if t.category == "base"][: args.tasks]
    flat = [t for t in tasks for _ in range(args.group)]
    policies = {s: load_policy(ModelConfig(profile=args.profile)) for s in ("recompute", "engine")}
    limits = dict(max_new_tokens=args.max_new_tokens, max_steps=2)
    t0 = time.perf_counter()
    with make_engine(RolloutConfig(**limits), policies["recompute"], BFCL) as hf:
        recorded = hf.rollout(flat, [HIGH, LOW] * (len(flat) // 2) + [HIGH] * (len(flat) % 2))
    sampled = sum(r.n_sampled for r in recorded)
    tokens = sum(len(r.ids) for r in recorded)
    print(f"{len(recorded)} rollouts recorded in {time.perf_counter() - t0:.1f} s: "
          f"{tokens} tokens, {sampled} sampled")  # fmt: skip
    out = tempfile.TemporaryDirectory(prefix="rcgrpo-bench-")  # nothing written there
    trainers = {}
    for setting, policy in policies.items():
        cfg = RLConfig(out_dir=os.path.join(out.name, setting), tasks_per_step=args.tasks,
                       group_size=args.group, micro_batch_size=args.micro, lr=1e-5,
                       kl_coef=args.kl_coef, advantage="sign", behaviour_logprobs=setting)  # fmt: skip
        trainers[setting] = Trainer(policy, Replay(recorded), tasks, cfg, BFCL.scorer(cfg.protocol))
    seconds: dict[str, list[float]] = {s: [] for s in trainers}
    for step in range(1, args.steps + 2):
        order = list(trainers) if step % 2 else list(reversed(trainers))
        for setting in order:
            m = trainers[setting].train_step(step)
            if step > 1:  # step 1: warm-up
                seconds[setting].append(m["perf/step_s"] - m["perf/rollout_s"])
    for setting, values in seconds.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{setting:9s} update s: {shown}; median {statistics.median(values):.2f}")
    out.cleanup()
    ratios = [e / r for e, r in zip(seconds["engine"], seconds["recompute"], strict=True)]
    print(f"load after: {os.getloadavg()}")
    print(f"engine/recompute update time: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
