"""Multi-process training through accelerate: data-parallel ranks, one update = the 1-process one.

accelerate enters the project here and nowhere else. With one process (plain `rcgrpo train ...`,
no WORLD_SIZE > 1 in the environment) `launched()` is False, `for_training` gives `Single`
(same interface, plain backward and clipping), accelerate is never imported and the training
loops run exactly as a loop without it. Under `accelerate launch` every rank loads the same
seeded model and data and computes the same batch schedule; each optimizer batch's micro-batches
are split between the ranks (contiguous shares, accelerate's split_between_processes), the model
is wrapped by `accelerator.prepare` (DDP; FSDP when the accelerate config says so) and the
gradients are all-reduced once per optimizer step (`no_sync` on all but the last micro-batch).

Normalisation is the 1-process one: the loops divide each micro-batch's summed loss by the token
(or sequence) count of the GLOBAL batch, which every rank knows; DDP averages over ranks, so
`backward` multiplies by the world size and the all-reduced gradient is the sum over all
micro-batches of the global batch -- the 1-process gradient (tests/test_distributed.py: weights
and losses of 2 gloo CPU processes equal 1 process to 1e-6). A rank with fewer micro-batches
than the others (a batch of M micro-batches, M not a multiple of the world size) runs a
zero-weight copy of one, so every rank joins the same number of all-reduces.

RL rollouts (rcgrpo.training.grpo.trainer): rank 0 samples the whole batch and broadcasts the rollouts;
the other ranks wait. The rollouts are then exactly those of a 1-process run (the engine's
sampling stream is seeded per call, so splitting the tasks could change them), and
multi-node rollout scaling is the Ray backend's job (rcgrpo.rollout.execution). Only the update is
sharded. Checkpoints, the final model and logged metrics are written by rank 0 only.

    accelerate launch --num_processes 8 -m rcgrpo.cli train rctp --model-set profile=qwen2.5-7b-instruct
    accelerate launch --num_processes 8 -m rcgrpo.cli train rl      # RL: rank 0 rolls out
    accelerate launch --multi_gpu --num_processes 2 -m rcgrpo.cli train sft   # CPU box: gloo

On GPUs accelerate turns --multi_gpu on by itself (8 processes, 8 GPUs, nccl). On a CPU-only
box `--multi_gpu` starts the ranks (torch.distributed.run) and the Accelerator runs them on the
CPU over gloo; `--cpu` alone starts one process (several only through mpirun). FSDP (full
fine-tuning of 7B, whose fp32 weights + Adam state do not fit one GPU) is the accelerate config
switch: `accelerate config` -> FSDP, or `accelerate launch --use_fsdp --fsdp_version 2
--fsdp_state_dict_type FULL_STATE_DICT --num_processes 8 -m rcgrpo.cli train sft ...`; the
loops need no change, but FSDP is not run in this CPU-only project (only DDP over gloo is
tested), and saving the final model from FSDP shards is untested.
"""

from __future__ import annotations

import contextlib
import os

import torch


def for_training(model: torch.nn.Module, optimizer, params: list) -> Ranks | Single:
    """The ranks of this training loop: `Ranks` under `accelerate launch`, else `Single`."""
    return Ranks(model, optimizer) if launched() else Single(model, params)


def launched() -> bool:
    """True inside `accelerate launch` / torchrun with more than one process (env WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def is_main() -> bool:
    """Rank 0, or the only process: the one that writes checkpoints, models and metrics."""
    return int(os.environ.get("RANK", "0")) == 0


class Ranks:
    """The accelerate glue of one training loop: the wrapped model, shares, backward, reduce."""

    def __init__(self, model: torch.nn.Module, optimizer):
        from accelerate import Accelerator

        # reads the launcher's env (ranks, FSDP); without a GPU: processes on the CPU over gloo
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
        if self.accelerator.num_processes < 2:  # launched, yet accelerate sees one process
            raise RuntimeError(
                f"WORLD_SIZE={os.environ['WORLD_SIZE']} but accelerate set up "
                f"{self.accelerator.distributed_type} with one process: launch with "
                "`accelerate launch --multi_gpu --num_processes N` or torchrun"
            )
        # the DDP/FSDP-wrapped module that forwards run through (DDP arms its all-reduce in its
        # forward); it shares the parameters of the module given, which checkpoints and
        # save_policy keep using
        self.model, self.optimizer = self.accelerator.prepare(_Call(model), optimizer)
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes

    def forward(self, fn, *args):
        """fn(model, *args) inside the wrapped model's forward, e.g. sft.summed_ce: the loops
        compute log-probs through the decoder and head (rcgrpo.training.forward), not model.forward."""
        return self.model(fn, *args)

    def share(self, micro_batches: list) -> list[tuple[object, float]]:
        """This rank's (micro-batch, weight 1.0) of the global list, padded with (a micro-batch,
        0.0) to ceil(M / world) entries so every rank does the same number of backwards."""
        with self.accelerator.split_between_processes(list(micro_batches)) as mine:
            mine = list(mine)
        n = -(-len(micro_batches) // self.world)
        return [(m, 1.0) for m in mine] + [(micro_batches[0], 0.0)] * (n - len(mine))

    def syncing(self, i: int, n: int):
        """Context for forward + backward i of n: gradients all-reduce on the last one only."""
        return contextlib.nullcontext() if i == n - 1 else self.accelerator.no_sync(self.model)

    def backward(self, loss: torch.Tensor) -> None:
        # DDP averages over ranks; the loss is already normalised by the global batch, so
        # scaling by the world size makes the all-reduced gradient the global-batch sum.
        self.accelerator.backward(loss * self.world)

    def clip(self, max_norm: float) -> torch.Tensor:
        return self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)

    def sum(self, values: list[float]) -> list[float]:
        """Per-rank floats (logged losses, stats) summed over the ranks, in one all-reduce."""
        t = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(t, reduction="sum").tolist()

    def broadcast(self, obj):
        """Rank 0's Python object on every rank (the RL rollouts)."""
        from accelerate.utils import broadcast_object_list

        box = [obj if self.rank == 0 else None]
        return broadcast_object_list(box, from_process=0)[0]


class Single:
    """One process: the interface of `Ranks`, doing what a plain loop does (accelerate is never
    imported; every share has weight 1.0, so the numbers are those of a loop without it)."""

    rank, world = 0, 1

    def __init__(self, model: torch.nn.Module, params: list):
        self.inner, self.params = model, params

    def forward(self, fn, *args):
        return fn(self.inner, *args)

    def share(self, micro_batches: list) -> list[tuple[object, float]]:
        return [(m, 1.0) for m in micro_batches]

    def syncing(self, i: int, n: int):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip(self, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(self.params, max_norm)

    def sum(self, values: list[float]) -> list[float]:
        return list(values)

    def broadcast(self, obj):
        return obj


class _Call(torch.nn.Module):
    """The model with a forward that calls fn(model, *args): what DDP/FSDP wrap."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = model

    def forward(self, fn, *args):
        return fn(self.inner, *args)
