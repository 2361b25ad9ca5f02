"""A few SFT or RL steps of the shared toy model on fixed data, for tests/test_distributed.py.

Run as 1 process (`python tests/distributed_worker.py sft|rl OUT`) or under
`accelerate launch --multi_gpu --num_processes 2 tests/distributed_worker.py sft|rl OUT` (on a
CPU-only box accelerate runs the ranks on the CPU over gloo); rank 0 writes the final weights,
the last step's gradients and the per-step metrics to OUT (torch.save).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # toy_models
from toy_models import tiny_llama  # noqa: E402

from rcgrpo.training import distributed  # noqa: E402
from rcgrpo.training.sft import SFTConfig, train_sft  # noqa: E402


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


def run(out_dir: str, stage: str = "sft") -> dict:
    if stage == "sft":
        model = tiny_llama(32, seed=0)
        # 12 examples, batches of 6 = 3 micro-batches of 2 per step: 2 ranks get 2 and 1 (+ a
        # zero-weight one); 2 epochs = 4 optimizer steps with warmup, decay and clipping on
        cfg = SFTConfig(
            batch_size=6, micro_batch_size=2, epochs=2, lr=1e-3, warmup_ratio=0.25, out_dir=out_dir
        )
        history = train_sft(model, data(), cfg)
    else:  # RC-GRPO, 2 steps x 2 PPO passes x 2 mini-batches of 3 micro-batches, KL on
        from test_trainer import TASKS, ToyEngine, tiny_policy

        from rcgrpo.training.grpo.trainer import RLConfig, Trainer

        policy = tiny_policy()
        model = policy.model
        cfg = RLConfig(
            tasks_per_step=3, group_size=4, steps=2, inner_epochs=2, mini_batch_size=6,
            micro_batch_size=2, lr=1e-3, save_every=0, out_dir=out_dir,
        )  # fmt: skip
        history = Trainer(policy, ToyEngine(policy), TASKS, cfg).train()
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_initialized() else 1
    backend = None
    if distributed.launched():  # what accelerate set up: (MULTI_CPU, gloo) on a CPU box
        from accelerate.state import PartialState

        state = PartialState()
        backend = (str(state.distributed_type), state.backend)
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "history": history,
        # the gradient of the last step (after clipping): DDP's all-reduced one under launch
        "grads": {k: p.grad.detach().clone() for k, p in model.named_parameters()},
        "world": world,
        "backend": backend,
    }


if __name__ == "__main__":
    result = run(str(Path(sys.argv[2]).parent / "work"), sys.argv[1])
    if distributed.is_main():
        torch.save(result, sys.argv[2])
