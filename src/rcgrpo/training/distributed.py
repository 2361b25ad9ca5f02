"""Multi-process training through accelerate: data-parallel ranks, one update = the 1-process one.

accelerate enters the project here and nowhere else. With one process (plain `rcgrpo stage ...`,
no WORLD_SIZE > 1 in the environment) `launched()` is False, `for_training` gives `Single`
(same interface, plain backward and clipping), accelerate is never imported and the training
loops run exactly as a loop without it. Under `accelerate launch` every rank loads the same
seeded model and data and computes the same batch schedule; each optimizer batch's micro-batches
are dealt to the ranks by estimated cost (rcgrpo.training.balance, docs/balance.md), the model
is wrapped by `accelerator.prepare` (DDP; FSDP when the accelerate config says so) and the
gradients are all-reduced once per optimizer step (`no_sync` on all but the last micro-batch).

Normalisation is the 1-process one: the loops divide each micro-batch's summed loss by the token
(or sequence) count of the GLOBAL batch, which every rank knows; DDP averages over ranks, so
`backward` multiplies by the world size and the all-reduced gradient is the sum over all
micro-batches of the global batch -- the 1-process gradient (tests/test_distributed.py: weights
and losses of 2 gloo CPU processes equal 1 process to 1e-6). A rank with fewer micro-batches
than the others (a batch of M micro-batches, M not a multiple of the world size) runs a
zero-weight copy of one, so every rank joins the same number of all-reduces.

Devices: each rank binds its GPU from LOCAL_RANK before anything is loaded (`local_device`:
model.device auto/cuda -> cuda:LOCAL_RANK, torch.cuda.set_device), so the weights load straight
onto it, never onto GPU 0 first.

RL (rcgrpo.training.grpo): every rank owns its rollout engine on its own device (the HF engine
runs on the rank's model; a vLLM server is pinned to the rank's GPU, rollout/vllm_server.py).
A step's groups are split between the ranks (`group_share`: contiguous whole groups) and each
rank rolls out its share with the episode indices of the whole batch (Engine.rollout's
first_index), so every episode has the seeds it has in one process; the sampled ids, loss masks
and log-probs are then gathered (`gather`, in rank order = the 1-process order). pi_old and the
reference log-probs are sharded like the update: a rank computes them for the micro-batches it
trains on in the first PPO pass, and one all-reduce (`merge`) gives every rank the whole batch's
(later passes reshuffle). The process-group timeout covers the longest wait, one rank's rollout
(`collective_timeout_s`, from the rollout budget; NCCL's default 10 min would kill a long one).
Checkpoints, the final model and logged metrics are written by rank 0 only.

    rcgrpo stage rctp --procs 8 --set model.profile=qwen2.5-7b-instruct   # rcgrpo.training.launch
    rcgrpo stage rl --procs 8                   # RL: every rank rolls out
    rcgrpo run --procs 8 --preset paper ...     # the pipeline, its training stages on 8 ranks
    rcgrpo stage sft --procs 2 --allow-cpu      # CPU box: gloo

Ranks started by hand (`accelerate launch`, `torchrun`) train once RCGRPO_RUN_SECRET names the
run's secret file (rcgrpo.training.rendezvous). On GPUs accelerate turns --multi_gpu on by
itself (8 processes, 8 GPUs, nccl). On a CPU-only box `--multi_gpu` starts the ranks
(torch.distributed.run) and the Accelerator runs them on the CPU over gloo; `--cpu` alone
starts one process (several only through mpirun). FSDP (full fine-tuning of 7B, whose fp32
weights + Adam state do not fit one GPU) is the accelerate config switch: `accelerate config`
-> FSDP, or `accelerate launch --use_fsdp --fsdp_version 2 --fsdp_state_dict_type
FULL_STATE_DICT --num_processes 8 -m rcgrpo.cli stage sft ...`; the loops need no change, but
FSDP is not run in this CPU-only project (only DDP over gloo is tested), and saving the final
model from FSDP shards is untested.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch

from rcgrpo.training import balance
from rcgrpo.training.rank_bytes import all_gather_bytes

MIN_TIMEOUT_S = 1800.0  # the process-group timeout is never shorter (30 min)
DECODE_STEPS_PER_S_FLOOR = 10.0  # a slow GPU's decode steps per second (7B, 64 rows, long K/V)


def for_training(
    model: torch.nn.Module, optimizer, params: list, timeout_s: float = MIN_TIMEOUT_S
) -> Ranks | Single:
    """The ranks of this training loop: `Ranks` under `accelerate launch` / torchrun (with a
    process-group timeout of timeout_s), else `Single`."""
    return Ranks(model, optimizer, timeout_s) if launched() else Single(model, params)


def local_device(device: str) -> str:
    """The device this process loads and trains on. Under a launcher with GPUs, "auto" and
    "cuda" mean cuda:LOCAL_RANK, made the current device here, before anything is loaded;
    without GPUs the ranks run on the CPU. One process: the device as given."""
    if not launched():
        return device
    cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    if not cuda and device.startswith("cuda"):
        raise ValueError(
            f"model.device={device} under a launcher of {os.environ['WORLD_SIZE']} processes "
            "would put every rank on one GPU: set model.device to cuda or auto (cuda:LOCAL_RANK)"
        )
    if not cuda:
        return "cpu" if device == "auto" else device
    index = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(index)
    return f"cuda:{index}"


def group_share(n_groups: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of the groups rank `rank` of `world` rolls out: contiguous, sizes differ
    by at most one, the first ranks take the extra (7 groups on 2 ranks: (0, 4), (4, 7))."""
    base, extra = divmod(n_groups, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def collective_timeout_s(
    episodes: int,
    concurrent: int,
    max_total_tokens: int,
    steps_per_s: float = DECODE_STEPS_PER_S_FLOOR,
) -> float:
    """Seconds a rank may wait in a collective for the slowest rank's rollout when every episode
    runs to its budget: `concurrent` episodes at a time (`rollout_pace`: the configured
    engine's), ceil(episodes / concurrent) waves of max_total_tokens decode steps at
    `steps_per_s`; never under MIN_TIMEOUT_S. The paper preset on 8 ranks with the HF engine
    (160 episodes, batches of 64, 81,920 tokens, 10 steps/s): 24,576 s (6.8 h), where NCCL's
    default 10 min would end a long rollout step as a hang. A hang is named long before this by
    the ranks' heartbeats (rcgrpo.training.heartbeat)."""
    waves = math.ceil(max(episodes, 1) / max(concurrent, 1))
    return max(MIN_TIMEOUT_S, waves * max_total_tokens / max(steps_per_s, 1e-9))


def rollout_pace(rollout_cfg, profile: str, model: torch.nn.Module) -> tuple[int, float]:
    """(episodes one rank's engine runs at once, its decode steps per second), the throughput
    the collective timeout is sized by. HF: rollout.max_batch at DECODE_STEPS_PER_S_FLOOR. vLLM
    on a GPU: the episodes its KV cache holds at the budget and the decode rate of the plan's
    cost model on this GPU (rcgrpo.training.plan.timing.vllm_pace), never below the floor;
    elsewhere its --max-num-seqs at the floor."""
    floor = DECODE_STEPS_PER_S_FLOOR
    if getattr(rollout_cfg, "engine", "hf") != "vllm":
        return rollout_cfg.max_batch, floor
    seqs, weight = rollout_cfg.vllm_max_num_seqs, model.get_input_embeddings().weight
    if weight.device.type != "cuda":  # the CPU build: no KV figure to size it by
        return seqs, floor
    from rcgrpo.training.plan.timing import vllm_pace

    props = torch.cuda.get_device_properties(weight.device)
    util, tokens = rollout_cfg.vllm_gpu_memory_utilization, rollout_cfg.max_total_tokens
    b, name, gpu = weight.element_size(), props.name, props.total_memory
    pace = vllm_pace(profile, b, name, gpu, util, tokens, seqs)
    return (seqs, floor) if pace is None else (pace[0], max(floor, pace[1]))


def launched() -> bool:
    """True inside `accelerate launch` / torchrun with more than one process (env WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def is_main() -> bool:
    """Rank 0, or the only process: the one that writes checkpoints, models and metrics."""
    return int(os.environ.get("RANK", "0")) == 0


class Ranks:
    """The accelerate glue of one training loop: the wrapped model, shares, backward, reduce."""

    def __init__(self, model: torch.nn.Module, optimizer, timeout_s: float = MIN_TIMEOUT_S):
        from datetime import timedelta

        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs

        # reads the launcher's env (ranks, FSDP); a model on the CPU: processes over gloo
        cpu = next(model.parameters()).device.type == "cpu"
        timeout = InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s))
        self.accelerator = Accelerator(cpu=cpu, kwargs_handlers=[timeout])
        if self.accelerator.num_processes < 2:  # launched, yet accelerate sees one process
            raise RuntimeError(
                f"WORLD_SIZE={os.environ['WORLD_SIZE']} but accelerate set up "
                f"{self.accelerator.distributed_type} with one process: launch with "
                "`accelerate launch --multi_gpu --num_processes N` or torchrun"
            )
        # before anything else crosses: every rank holds this run's secret (node 0 wrote it)
        from rcgrpo.training.rendezvous import prove

        prove(self.accelerator.device)
        # the DDP/FSDP-wrapped module that forwards run through (DDP arms its all-reduce in its
        # forward); it shares the parameters of the module given, which checkpoints and
        # save_policy keep using
        self.model, self.optimizer = self.accelerator.prepare(_Call(model), optimizer)
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.waiting = _not_watched  # a heartbeat's `waiting` (rcgrpo.training.heartbeat)

    def forward(self, fn, *args):
        """fn(model, *args) inside the wrapped model's forward, e.g. sft.summed_ce: the loops
        compute log-probs through the decoder and head (rcgrpo.training.forward), not model.forward."""
        return self.model(fn, *args)

    def share(
        self, micro_batches: list, costs: list | None = None, filler=None
    ) -> list[tuple[object, float]]:
        """This rank's (micro-batch, weight 1.0) of the global list, dealt by estimated cost
        (`costs`, one per micro-batch: rcgrpo.training.balance.micro_costs; without them all
        cost the same), padded with (`filler`, 0.0) to the fullest rank's count: equal numbers
        of backwards. filler: any micro-batch, the cheaper the better (default: the cheapest of
        the list; the RL update passes its shortest row alone)."""
        if not micro_batches:
            return []
        costs = [1.0] * len(micro_batches) if costs is None else costs
        parts = balance.partition(costs, self.world)
        n = max(len(p) for p in parts)
        if filler is None:
            filler = micro_batches[min(range(len(costs)), key=costs.__getitem__)]
        mine = [(micro_batches[i], 1.0) for i in parts[self.rank]]
        return mine + [(filler, 0.0)] * (n - len(mine))

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
        with self.waiting("sum"):
            return self.accelerator.reduce(t, reduction="sum").tolist()

    def group_share(self, n_groups: int) -> tuple[int, int]:
        """[start, end) of the groups this rank rolls out (`group_share`)."""
        return group_share(n_groups, self.rank, self.world)

    def gather(self, data: bytes) -> list[bytes]:
        """Every rank's bytes, in rank order, on every rank (the RL rollouts, encoded by
        training.grpo.exchange: never pickles, which would run what another rank sent)."""
        with self.waiting("gather"):  # the slowest rank's rollout: waiting, not stalled
            return all_gather_bytes(data, self.world, self.accelerator.device)

    def merge(self, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
        """Each tensor summed over the ranks (one all-reduce each, on the accelerator's device),
        back on its own device: rows each rank filled alone (zeros elsewhere) become the whole
        batch's on every rank."""
        out = []
        with self.waiting("merge"):  # the other ranks' share of pi_old / the reference
            for t in tensors:
                if t is not None:
                    t = self.accelerator.reduce(t.to(self.accelerator.device), "sum").to(t.device)
                out.append(t)
        return out


class Single:
    """One process: the interface of `Ranks`, doing what a plain loop does (accelerate is never
    imported; every share has weight 1.0, so the numbers are those of a loop without it)."""

    rank, world = 0, 1

    def __init__(self, model: torch.nn.Module, params: list):
        self.inner, self.params = model, params

    def forward(self, fn, *args):
        return fn(self.inner, *args)

    def share(
        self, micro_batches: list, costs: list | None = None, filler=None
    ) -> list[tuple[object, float]]:
        return [(m, 1.0) for m in micro_batches]

    def syncing(self, i: int, n: int):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip(self, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(self.params, max_norm)

    def sum(self, values: list[float]) -> list[float]:
        return list(values)

    def group_share(self, n_groups: int) -> tuple[int, int]:
        return 0, n_groups

    def gather(self, data: bytes) -> list[bytes]:
        return [data]

    def merge(self, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
        return list(tensors)


def _not_watched(_what: str):
    return contextlib.nullcontext()


class _Call(torch.nn.Module):
    """The model with a forward that calls fn(model, *args): what DDP/FSDP wrap."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.inner = model

    def forward(self, fn, *args):
        return fn(self.inner, *args)
