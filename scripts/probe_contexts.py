"""What `rcgrpo plan` assumes about GPU memory outside PyTorch's allocator, measured on one GPU
and printed beside each assumed value, so a GPU session can replace the assumptions in
rcgrpo.training.plan.constants: a process's CUDA context (CUDA_CONTEXT_GB), NCCL's
communicator buffers (NCCL_GB) and the floor of vLLM's context (VLLM_CONTEXT_GB). The sleeping
server's share (rcgrpo.rollout.colocate.VLLM_ASLEEP_SHARE) needs vLLM itself, which the probe
machine lacks: it is printed as assumed, with the bytes it stands for.

Why `total - free - reserved`: the context, cuBLAS's workspace and NCCL's buffers live outside
PyTorch's caching allocator, so torch.cuda.memory_reserved() never shows them; the device's used
memory less what the allocator holds is what the process costs beyond its tensors. It counts
every process on the device: run it on an otherwise idle GPU. Without CUDA it prints the
assumed values and says they were not measured.

    .venv/bin/python scripts/probe_contexts.py   # also run first by scripts/gpu_update_probe.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

GB = 1e9


def non_torch() -> int:
    """Bytes used on the current device that PyTorch's allocator does not hold."""
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def nccl_buffers() -> int | None:
    """What a 1-rank NCCL communicator and one all-reduce add outside the allocator (None: no
    NCCL). A lower bound of NCCL_GB: 8 ranks open channels to 7 peers, one rank to none."""
    import torch.distributed as dist

    if not dist.is_nccl_available() or dist.is_initialized():
        return None
    before = non_torch()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        return non_torch() - before
    finally:
        dist.destroy_process_group()


def measure_contexts() -> dict[str, float | None]:
    """Measure on the current CUDA device (None where not measurable) and print one line per
    assumed constant: name, assumed, measured."""
    from rcgrpo.rollout.colocate import VLLM_ASLEEP_SHARE
    from rcgrpo.training.plan import constants as C

    measured: dict[str, float | None] = {"cuda_context": None, "nccl": None, "vllm_floor": None}
    if torch.cuda.is_available():
        x = torch.ones(1024, 1024, device="cuda", dtype=torch.bfloat16)
        float((x @ x).sum())  # loads cuBLAS and its workspace, as a first training matmul does
        context = non_torch() / GB
        try:
            nccl = nccl_buffers()
        except Exception as e:  # a one-shot GPU run goes on without this one figure
            print(f"NCCL not measured: {type(e).__name__}: {e}")
            nccl = None
        measured = {
            "cuda_context": context,
            "nccl": None if nccl is None else nccl / GB,
            "vllm_floor": context,  # vLLM's process holds at least a context of its own
        }
    asleep = VLLM_ASLEEP_SHARE * 80 * C.PHYSICAL_PER_GB / GB
    rows = [
        ("CUDA context per process + cuBLAS", "cuda_context", C.CUDA_CONTEXT_GB, ""),
        ("NCCL buffers per trainer", "nccl", C.NCCL_GB, " (1 rank: a lower bound)"),
        ("vLLM context + non-torch memory", "vllm_floor", C.VLLM_CONTEXT_GB, " (a floor)"),
    ]
    print("assumed memory constants (rcgrpo.training.plan.constants), measured here:")
    for name, key, assumed, note in rows:
        value = measured[key]
        why = "no NCCL" if torch.cuda.is_available() else "no CUDA device"
        got = f"not measured ({why})" if value is None else f"measured {value:.3f} GB{note}"
        print(f"  {name:<36} assumed {assumed:.2f} GB   {got}")
    print(
        f"  {'vLLM asleep (colocate share)':<36} assumed {VLLM_ASLEEP_SHARE:.0%} "
        f"= {asleep:.2f} GB of an 80 GB GPU   not measured (needs vLLM, not on this machine)"
    )
    return measured


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    measure_contexts()
