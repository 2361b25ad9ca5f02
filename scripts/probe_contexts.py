"""What `rcgrpo plan` assumes about GPU memory outside PyTorch's allocator, measured and printed
beside each assumed value (rcgrpo.training.plan.constants): a process's CUDA context
(CUDA_CONTEXT_GB: every trainer rank has one, and so has every vLLM server, outside its share)
and NCCL's communicator buffers (NCCL_GB), the latter over every GPU this machine has (one rank
per GPU and one all-reduce, as DDP's; with one GPU there are no peers and nothing to measure).
vLLM's non-torch memory inside its share and the sleeping server's share
(rcgrpo.rollout.colocate.VLLM_ASLEEP_SHARE) need vLLM itself: printed as assumed.

Why `total - free - reserved`: the context, cuBLAS's workspace and NCCL's buffers live outside
PyTorch's caching allocator, so torch.cuda.memory_reserved() never shows them; the device's used
memory less what the allocator holds is what the process costs beyond its tensors. It counts
every process on the device: run it on an otherwise idle GPU. Without CUDA it prints the
assumed values and says they were not measured (the NCCL path runs on two gloo CPU ranks).

    .venv/bin/python scripts/probe_contexts.py   # also run by scripts/gpu_day_one.sh
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

GB = 1e9
NCCL_TIMEOUT_S = 180  # every rank's init + one all-reduce; a hang is not measured


def non_torch() -> int:
    """Bytes used on the current device that PyTorch's allocator does not hold."""
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved()


def measure_contexts() -> dict[str, float | None]:
    """The CUDA context (+ cuBLAS workspace) of this process in GB, None without CUDA; prints
    one line per assumed constant: name, assumed, measured."""
    from rcgrpo.rollout.colocate import VLLM_ASLEEP_SHARE
    from rcgrpo.training.plan import constants as C

    context = None
    if torch.cuda.is_available():
        x = torch.ones(1024, 1024, device="cuda", dtype=torch.bfloat16)
        float((x @ x).sum())  # loads cuBLAS and its workspace, as a first training matmul does
        context = non_torch() / GB
    print("assumed memory constants (rcgrpo.training.plan.constants), measured here:")
    got = "not measured (no CUDA device)" if context is None else f"measured {context:.3f} GB"
    print(f"  {'CUDA context per process + cuBLAS':<36} assumed {C.CUDA_CONTEXT_GB:.2f} GB   {got}")
    print(
        f"  {'vLLM non-torch memory (in its share)':<36} assumed {C.VLLM_NON_TORCH_GB:.2f} GB"
        "   not measured (needs vLLM)"
    )
    asleep = VLLM_ASLEEP_SHARE * 80 * C.PHYSICAL_PER_GB / GB
    print(
        f"  {'vLLM asleep (colocate share)':<36} assumed {VLLM_ASLEEP_SHARE:.0%} "
        f"= {asleep:.2f} GB of an 80 GB GPU   not measured (needs vLLM)"
    )
    return {"cuda_context": context}


def _rank(rank: int, world: int, backend: str, folder: str) -> None:
    """One rank: its context, then a communicator and one all-reduce; writes what NCCL added
    outside PyTorch's allocator to folder/rank-<rank>.json."""
    import torch.distributed as dist

    from rcgrpo.procs import set_parent_death_signal

    set_parent_death_signal(signal.SIGKILL)  # dies with the probe, however it ends
    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
        x = torch.ones(1024, 1024, device="cuda", dtype=torch.bfloat16)
        float((x @ x).sum())
    before = non_torch() if cuda else 0
    store = dist.FileStore(str(Path(folder) / "store"), world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    try:
        t = torch.ones(1 << 20, device="cuda" if cuda else "cpu")
        dist.all_reduce(t)
        if cuda:
            torch.cuda.synchronize()
        added = non_torch() - before if cuda else None
    finally:
        dist.destroy_process_group()
    Path(folder, f"rank-{rank}.json").write_text(json.dumps({"added": added}))


def measure_nccl(folder: Path) -> tuple[float | None, str]:
    """(GB the most loaded rank's NCCL adds, how) over one rank per visible GPU, or (None, why);
    the ranks meet in a FileStore in `folder` (emptied and removed after). Without CUDA two
    gloo ranks run the same steps (nothing to measure)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 1:
        return None, "one GPU: NCCL's buffers need peers (>= 2 GPUs)"
    backend, world = ("nccl", gpus) if gpus else ("gloo", 2)
    import torch.multiprocessing as mp

    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        ctx = mp.start_processes(_rank, (world, backend, str(folder)), world, join=False)
        deadline = time.monotonic() + NCCL_TIMEOUT_S
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                return None, f"{world} ranks did not finish an all-reduce in {NCCL_TIMEOUT_S} s"
        added = [json.loads(p.read_text())["added"] for p in folder.glob("rank-*.json")]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not gpus:
        return None, "no CUDA device; two gloo CPU ranks ran the same steps"
    return max(added) / GB, f"{world} ranks, one all-reduce: the most any rank added"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default="cache/probe-nccl", help="where the NCCL ranks meet")
    args = ap.parse_args()
    measure_contexts()
    value, how = measure_nccl(Path(args.folder))
    print(f"  NCCL buffers per trainer: {how}" + ("" if value is None else f": {value:.3f} GB"))
