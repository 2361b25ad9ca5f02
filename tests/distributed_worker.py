"""A few SFT or RL steps on fixed data, for tests/test_distributed.py.

Run as 1 process (`python tests/distributed_worker.py sft|rl|rl-hf OUT`) or under
`accelerate launch --multi_gpu --num_processes 2 tests/distributed_worker.py STAGE OUT` (on a
CPU-only box accelerate runs the ranks on the CPU over gloo; `torchrun --nproc_per_node 2` works
the same); rank 0 writes the final weights, the last step's gradients, the per-step metrics and
what each rank rolled out to OUT (torch.save).

Stages: `sft` and `rl` train the shared toy model (rl through test_trainer's ToyEngine); `rl-hf`
is RC-GRPO on the tiny profile with LoRA through the real HF engine on BFCL tasks, each rank
loading its own policy and building its own engine (rcgrpo.rollout.execution.make_engine on its
device), plus one greedy rollout of a step's groups split between the ranks; `rl-hf-engine` is
`rl-hf` with pi_old from the engine and the token weight (rl.behaviour_logprobs, rl.engine_is:
the first pass's log-probs merged over the ranks). `rl-stall` is `rl`
with heartbeats every 0.2 s and a 3 s stall window (tests/test_scale.py makes a rank hang).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # toy_models
from toy_models import tiny_llama  # noqa: E402

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.training import distributed  # noqa: E402
from rcgrpo.training.sft import train_sft  # noqa: E402
from rcgrpo.training.sft_config import SFTConfig  # noqa: E402


def data(n: int = 12):
    """Prompt (mask 0) then an answer (mask 1) of uneven length: a per-rank token mean would
    weigh tokens differently from the global one."""
    out = []
    for i in range(n):
        prompt = torch.tensor([1, 2 + i % 4, 3])
        answer = torch.tensor([10 + i % 4, 20] + [21] * (i % 3) + [2])
        ids = torch.cat([prompt, answer])
        out.append((ids, torch.tensor([0] * len(prompt) + [1] * len(answer))))
    return out


def parity_reward(task, rollout):
    """A stand-in reward with variance (a random tiny model never solves a BFCL task, so every
    group would be all-0 and the update would vanish): the parity of the sampled ids' sum."""
    from rcgrpo.rollout.environment import Rewards

    r = int(sum(int(t) for t, m in zip(rollout.ids, rollout.loss_mask, strict=True) if m) % 2)
    return Rewards(float(r), {"paper": r, "bfcl": r})


def rl_hf(out_dir: str, engine_logprobs: bool = False) -> dict:
    """RC-GRPO on the tiny profile + LoRA through the HF engine: 4 tasks x G = 2 per step (each
    of 2 ranks rolls out 2 groups), PPO mini-batches, 2 passes, KL to the reference adapter."""

    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo import rollouts
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    device = distributed.local_device("auto")  # cpu here; cuda:LOCAL_RANK on a GPU box
    policy = load_policy(ModelConfig(profile="tiny", lora=True, lora_r=4, device=device))
    # an episode budget of 20,000 tokens (the episodes stop far earlier) makes the process
    # group's timeout 2,000 s, above the 30 min floor: the test reads it back from gloo
    limits = dict(max_new_tokens=12, max_total_tokens=20_000, max_steps=2, max_batch=8)
    device = policy.config.device  # resolved: cpu here
    engine = make_engine(RolloutConfig(temperature=1.0, **limits), policy, BFCL, device=device)
    tasks = tasks_in("train")[::60][:6]  # across the categories; short enough for the budget
    cfg = RLConfig(
        tasks_per_step=4, group_size=2, steps=2, inner_epochs=2, mini_batch_size=4,
        micro_batch_size=2, lr=2e-3, save_every=0, out_dir=out_dir, protocol="bfcl",
    )  # fmt: skip
    if engine_logprobs:
        cfg = dataclasses.replace(cfg, behaviour_logprobs="engine", engine_is="token")
    trainer = Trainer(policy, engine, tasks, cfg, parity_reward)
    # greedy: the step's groups split between the ranks give the 1-process rollouts
    greedy = make_engine(RolloutConfig(temperature=0.0, **limits), policy, BFCL, device=device)
    step_tasks, tokens = trainer.draw(1)
    g = rollouts.roll_out(greedy, trainer.ranks, step_tasks, tokens, cfg, 1, parity_reward)
    history = trainer.train()
    return {
        "model": policy.model,
        "history": history,
        "greedy": [r.ids.tolist() for r in g.rollouts],
        "greedy_own": g.own,
        "rolled_out": trainer.rolled_out,
        "timeout_s": trainer._timeout_s(),
    }


def run(out_dir: str, stage: str = "sft") -> dict:
    extra = {}
    if stage == "sft":
        model = tiny_llama(32, seed=0)
        # 12 examples, batches of 6 = 3 micro-batches of 2 per step: 2 ranks get 2 and 1 (+ a
        # zero-weight one); 2 epochs = 4 optimizer steps with warmup, decay and clipping on
        cfg = SFTConfig(
            batch_size=6, micro_batch_size=2, epochs=2, lr=1e-3, warmup_ratio=0.25, out_dir=out_dir
        )
        history = train_sft(model, data(), cfg)
    elif stage in (
        "rl",
        "rl-stall",
    ):  # RC-GRPO, 2 steps x 2 PPO passes x 2 mini-batches of 3 micro-batches, KL on
        from test_trainer import TASKS, ToyEngine, tiny_policy

        from rcgrpo.training.grpo.config import RLConfig
        from rcgrpo.training.grpo.trainer import Trainer

        policy = tiny_policy()
        model = policy.model
        cfg = RLConfig(
            tasks_per_step=3, group_size=4, steps=2, inner_epochs=2, mini_batch_size=6,
            micro_batch_size=2, lr=1e-3, save_every=0, out_dir=out_dir,
        )  # fmt: skip
        if stage == "rl-stall":  # beats every 0.2 s, a rank 3 s without progress is named
            cfg = dataclasses.replace(cfg, heartbeat_s=0.2, stall_s=3.0)
        trainer = Trainer(policy, ToyEngine(policy), TASKS, cfg, BFCL.scorer(cfg.protocol))
        history = trainer.train()
        extra["rolled_out"] = trainer.rolled_out
    else:
        extra = rl_hf(out_dir, engine_logprobs=stage == "rl-hf-engine")
        model, history = extra.pop("model"), extra.pop("history")
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_initialized() else 1
    backend = None
    if distributed.launched():  # what accelerate set up: (MULTI_CPU, gloo) on a CPU box
        from accelerate.state import PartialState

        state = PartialState()
        backend = (str(state.distributed_type), state.backend)
        pg = dist.distributed_c10d._get_default_group()
        extra["pg_timeout_s"] = pg._get_backend(
            torch.device("cpu")
        ).options._timeout.total_seconds()
    per_rank = {k: v for k, v in extra.items() if k in ("rolled_out", "greedy_own")}
    if world > 1:  # every rank's own counts, in rank order
        gathered = [None] * world
        dist.all_gather_object(gathered, per_rank)
        per_rank = {k: [g[k] for g in gathered] for k in per_rank}
    else:
        per_rank = {k: [v] for k, v in per_rank.items()}
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "history": history,
        # the gradient of the last step (after clipping): DDP's all-reduced one under launch
        "grads": {
            k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None
        },  # fmt: skip
        "world": world,
        "backend": backend,
        **extra,
        **per_rank,
    }


if __name__ == "__main__":
    result = run(str(Path(sys.argv[2]).parent / "work"), sys.argv[1])
    if distributed.is_main():
        torch.save(result, sys.argv[2])
