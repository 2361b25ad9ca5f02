"""The rollout engine's two efficiencies in `rcgrpo plan`'s decode cost model, measured on the
kernels an engine iteration runs (rcgrpo.training.plan.timing.Engine.iteration_s), at a model's
shapes, plus the device's peaks they are a share of:

* PREFILL_EFF: a prefill chunk of CHUNK_TOKENS tokens through one decoder layer's seven
  projections (cuBLAS GEMMs): 2 x tokens x the layer's weights FLOPs over the time, over the
  peak;
* BANDWIDTH_EFF: a decode iteration of `seqs` sequences at `context` tokens: the GEMMs of
  several layers (distinct weights, more than any cache holds: each read once) and the
  attention of one query token per sequence over its keys and values (SDPA, grouped heads):
  the bytes read (weights + K/V) over the time, over the bandwidth.

The peaks are the datasheet's for a GPU `rcgrpo plan` knows (constants.GPUS, by name), else
what this run measures (a bf16 matmul, a copy); a CPU has no datasheet, so its peaks are the
best any of its measurements reached. vLLM's own kernels (paged attention, CUDA graphs) are not
these: the figures stand for the kernel work of an iteration; its scheduling overhead
(ITERATION_S) needs vLLM.

    .venv/bin/python scripts/gpu_day_one.py --smoke --out cache/day-one-smoke
"""

from __future__ import annotations

import re
import statistics
import time

import torch


def timed(fn, dev, reps: int = 5) -> float:
    """Median seconds of fn() over `reps` runs after two warm-ups."""
    times = []
    for i in range(reps + 2):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def datasheet(name: str):
    """constants.GPUS' entry of a device name ("NVIDIA H100 80GB HBM3" -> h100), or None."""
    from rcgrpo.training.plan.constants import GPUS

    words = re.split(r"[\s_-]+", name.lower())
    return next((g for key, g in GPUS.items() if key in words), None)


def measured_peaks(dev, dtype) -> tuple[float, float]:
    """(FLOP/s of a square matmul, bytes/s of a copy) on this device."""
    n = 8192 if dev.type == "cuda" else 1024
    a = torch.randn(n, n, device=dev, dtype=dtype)
    flops = 2 * n**3 / timed(lambda: a @ a, dev)
    x = torch.empty((2**28 if dev.type == "cuda" else 2**24) // 4, device=dev)  # 256 / 16 MiB
    y = torch.empty_like(x)
    copy = 2 * x.nbytes / timed(lambda: y.copy_(x), dev)  # read + write
    return flops, copy


def layer_weights(arch, dev, dtype) -> list[torch.Tensor]:
    """One decoder layer's projections (in, out): q, k, v, o, gate, up, down."""
    d, i, q, kv = arch.hidden, arch.intermediate, arch.q_dim, arch.kv_dim
    shapes = [(d, q), (d, kv), (d, kv), (q, d), (d, i), (d, i), (i, d)]
    return [torch.randn(a, b, device=dev, dtype=dtype) * 0.01 for a, b in shapes]


def gemms(x: torch.Tensor, w: list[torch.Tensor]) -> torch.Tensor:
    """The seven projections of a layer for inputs x (n, d) (attention and MLP inputs stand-in)."""
    q, k, v = x @ w[0], x @ w[1], x @ w[2]
    o = q @ w[3]
    h = (x @ w[4]) * (x @ w[5])
    del k, v, o
    return h @ w[6]


@torch.no_grad()
def measure(arch, dev, dtype, chunk: int, seqs: int, context: int, layers: int) -> dict:
    """What the two efficiencies are made of (module docstring): FLOP/s of the prefill chunk,
    bytes/s of the decode iteration, and this device's matmul FLOP/s and copy bytes/s."""
    b = torch.finfo(dtype).bits // 8
    w = layer_weights(arch, dev, dtype)
    per_layer = sum(t.numel() for t in w)
    x = torch.randn(chunk, arch.hidden, device=dev, dtype=dtype)
    prefill_flops = 2 * chunk * per_layer / timed(lambda: gemms(x, w), dev)
    stack = [w] + [layer_weights(arch, dev, dtype) for _ in range(layers - 1)]
    xd = torch.randn(seqs, arch.hidden, device=dev, dtype=dtype)
    t_weights = timed(lambda: [gemms(xd, ws) for ws in stack], dev)
    shape = (seqs, arch.kv_heads, context, arch.head_dim)
    kv = [(torch.randn(shape, device=dev, dtype=dtype), torch.randn(shape, device=dev, dtype=dtype))
          for _ in range(layers)]  # fmt: skip
    # one new token per sequence: a KV head's group of query heads attends to all its keys, laid
    # out as that many query rows (no causal mask: the flash kernel, no repeated K/V)
    group = arch.heads // arch.kv_heads
    query = torch.randn(seqs, arch.kv_heads, group, arch.head_dim, device=dev, dtype=dtype)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    t_kv = timed(lambda: [sdpa(query, k, v) for k, v in kv], dev)
    read = layers * per_layer * b + sum(k.nbytes + v.nbytes for k, v in kv)
    decode_bw = read / (t_weights + t_kv)
    flops, copy = measured_peaks(dev, dtype)
    return {
        "prefill_flops": prefill_flops,
        "decode_bytes_per_s": decode_bw,
        "matmul_flops": flops,
        "copy_bytes_per_s": copy,
        "shape": {"chunk": chunk, "seqs": seqs, "context": context, "layers": layers},
    }


def peaks(dev, raw: dict, reached: list[float]) -> tuple[float, float, str]:
    """(peak FLOP/s, bandwidth, where they come from) that efficiencies are shares of; `raw`
    from `measure`, `reached`: the FLOP/s other measurements reached (a CPU's peak is the
    best of all)."""
    sheet = datasheet(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else None
    if sheet is not None:
        return sheet.bf16_flops, sheet.bandwidth, f"datasheet: {sheet.source}"
    if dev.type == "cuda":
        return raw["matmul_flops"], raw["copy_bytes_per_s"], "measured here (a GPU not in GPUS)"
    peak = max(raw["matmul_flops"], raw["prefill_flops"], *reached)
    bandwidth = max(raw["copy_bytes_per_s"], raw["decode_bytes_per_s"])
    return peak, bandwidth, "a CPU has no datasheet: the best this run's kernels reached"
