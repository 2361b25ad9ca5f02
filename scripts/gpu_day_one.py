"""One run measures a GPU for `rcgrpo plan`: the probes of its assumed constants, their results
in DIR/calibration.json (rcgrpo.training.plan.calibration), which `rcgrpo plan --calibration`
uses in their place. scripts/gpu_day_one.sh is the command; this is what it runs.

In one process, in this order: the trainer's allocator settings (rcgrpo.rollout.colocate, set
before CUDA initialises, as a trainer rank runs); the CUDA context and NCCL's buffers over every
GPU (scripts/probe_contexts.py); the engine's prefill and decode kernels at the model's shapes
(scripts/probe_kernels.py); the update cases of a random-init Qwen2.5-7B, padded and with
shared prefixes (scripts/gpu_update_probe.py). What each constant becomes:

    MFU, MFU_SHARED    typical rows, padded / shared: plan/flops.py's FLOPs / (time x peak)
    PREFILL_EFF        a prefill chunk's GEMMs;  BANDWIDTH_EFF  a decode iteration's reads
    CUDA_CONTEXT_GB    used - reserved after a bf16 matmul;  NCCL_GB  >= 2 GPUs, one all-reduce
    ALLOCATOR_SLACK    the largest peak reserved / peak allocated - 1 of the update cases
    VLLM_*, ITERATION_S, SYNC_S, CHUNK_TOKENS   need vLLM: left assumed, with that reason

`--smoke` runs the same steps on the CPU at a tiny width (hidden 256, 2 layers, episodes / 16)
and writes the same file, marked as a smoke run; its figures describe this CPU, not a GPU.

    scripts/gpu_day_one.sh --out cache/day-one            # a GPU box: < 8 min on one H100
    .venv/bin/python scripts/gpu_day_one.py --smoke --out cache/day-one-smoke
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

NEEDS_VLLM = "needs a vLLM server, which this script does not start"
KERNEL_SHAPES = {False: (8192, 64, 4096, 4), True: (1024, 8, 512, 2)}  # chunk, seqs, ctx, layers


def device_info(dev, settings: str, kernels: dict, peaks: tuple) -> dict:
    import peft
    import torch
    import transformers

    cuda = dev.type == "cuda"
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    from probe_kernels import datasheet

    from rcgrpo.training.plan.constants import GPUS

    sheet = datasheet(name) if cuda else None
    kind = next((k for k, g in GPUS.items() if g is sheet), None)
    return {
        "name": name,
        "kind": kind,
        "total_bytes": torch.cuda.mem_get_info(dev)[1] if cuda else None,
        "peak_flops": peaks[0],
        "bandwidth": peaks[1],
        "peaks_from": peaks[2],
        "matmul_flops": kernels["matmul_flops"],
        "copy_bytes_per_s": kernels["copy_bytes_per_s"],
        "allocator_settings": settings,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "python": sys.version.split()[0],
    }


def constants(cases, kernels, peaks, context, nccl, cuda: bool):
    """({KEY: (value, how)}, {KEY: why}) for calibration.dump."""
    by = {c["name"]: c for c in cases}
    measured, left = {}, {}
    for key, name in (("MFU", "typical rows"), ("MFU_SHARED", "typical rows, shared prefixes")):
        if name in by:
            measured[key] = (by[name]["mfu"], f"{name}: plan/flops.py FLOPs / (time x peak)")
        else:
            left[key] = f"no '{name}' case ran (see the probe's output)"
    chunk, seqs, ctx, layers = (kernels["shape"][k] for k in ("chunk", "seqs", "context", "layers"))
    measured["PREFILL_EFF"] = (
        kernels["prefill_flops"] / peaks[0],
        f"{chunk:,} tokens through one layer's 7 projections",
    )
    measured["BANDWIDTH_EFF"] = (
        kernels["decode_bytes_per_s"] / peaks[1],
        f"decode of {seqs} sequences at {ctx:,} tokens: {layers} layers' weights + K/V read",
    )
    no_cuda = "no CUDA device"
    if context is None:
        left["CUDA_CONTEXT_GB"] = no_cuda
    else:
        measured["CUDA_CONTEXT_GB"] = (context, "used - reserved after a bf16 matmul")
    if nccl[0] is None:
        left["NCCL_GB"] = nccl[1]
    else:
        measured["NCCL_GB"] = nccl
    if cuda:
        slack = max(c["peak_reserved"] / c["peak_allocated"] - 1 for c in cases)
        measured["ALLOCATOR_SLACK"] = (max(slack, 0.0), "largest peak reserved / allocated - 1")
    else:
        left["ALLOCATOR_SLACK"] = no_cuda
    for key in ("VLLM_NON_TORCH_GB", "VLLM_OVERHEAD_GB", "ITERATION_S", "SYNC_S"):
        left[key] = NEEDS_VLLM
    left["CHUNK_TOKENS"] = "a vLLM setting (max_num_batched_tokens): its startup log says it"
    return measured, left


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for calibration.json")
    ap.add_argument("--smoke", action="store_true", help="the CPU at a tiny width: a check")
    args = ap.parse_args(argv)
    from rcgrpo.rollout.colocate import trainer_allocator

    settings = trainer_allocator()  # first: PyTorch reads it when CUDA initialises
    import gpu_update_probe
    import probe_kernels
    import torch
    from probe_contexts import measure_contexts, measure_nccl

    from rcgrpo.training.plan import calibration

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("error: no CUDA device visible to this python (torch " + torch.__version__ + "): "
              "run it where torch sees the GPU, or pass --smoke for the CPU check", file=sys.stderr)  # fmt: skip
        return 2
    t0, out = time.perf_counter(), Path(args.out)
    dev = torch.device("cuda" if cuda else "cpu")
    if not cuda:  # the smoke: the project's CPU thread count (a busy box spins on more)
        from rcgrpo.runtime import torch_thread_count

        torch.set_num_threads(torch_thread_count())
    print(f"device {torch.cuda.get_device_name(dev) if cuda else 'cpu'}; allocator: {settings}")
    context = measure_contexts()["cuda_context"]
    nccl = measure_nccl(out / ".nccl")
    print(f"NCCL buffers per trainer: {nccl[1]}" + (f": {nccl[0]:.3f} GB" if nccl[0] else ""))
    probe_args = gpu_update_probe.parse(["--smoke"] if args.smoke else [])
    dtype = torch.bfloat16 if cuda else torch.float32
    from probe_cases import probe_arch

    arch = probe_arch(gpu_update_probe.config(probe_args))
    kernels = probe_kernels.measure(arch, dev, dtype, *KERNEL_SHAPES[args.smoke])
    result = gpu_update_probe.run(probe_args, dev)
    cases = result["cases"]
    peaks = probe_kernels.peaks(dev, kernels, [c["flops"] / c["seconds"] for c in cases])
    for c in cases:
        c["mfu"] = c["flops"] / c["seconds"] / peaks[0]
        print(f"{c['name']}: {c['flops'] / c['seconds'] / 1e12:.3g} TFLOP/s, MFU {c['mfu']:.3f}")
    measured, left = constants(cases, kernels, peaks, context, nccl, cuda)
    command = "scripts/gpu_day_one.sh" + (" --smoke" if args.smoke else "") + f" --out {out}"
    path = calibration.dump(
        out / "calibration.json",
        measured,
        left,
        device_info(dev, settings, kernels, peaks) | {"kernels": kernels},
        cases,
        args.smoke,
        command,
        datetime.date.today().isoformat(),
    )
    print(f"calibration ({peaks[2]}):")
    for key, (value, how) in measured.items():
        print(f"  {key:<18} measured {value:.4g}   {how}")
    for key, why in left.items():
        print(f"  {key:<18} assumed   {why}")
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s")
    print(f"next: rcgrpo plan --preset paper --profile qwen2.5-7b-instruct --calibration {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
