"""A vLLM server's share of its GPU at start: min(configured, (free - margin) / total), with free
and total read by torch.cuda.mem_get_info() on that GPU just before the server starts.

Why: vLLM 0.32 refuses to start when the GPU's free memory is below gpu_memory_utilization x
total ("Free memory on device ... less than desired GPU memory utilization"), and anything else
resident there counts against it: another stage's process, a trainer beside its server, a
process outside the project. A share the GPU cannot give is lowered to what it can, and said.
Why `MARGIN_GIB`: vLLM's own CUDA context exists before it measures free memory, outside its
share (the plan assumes 0.5 GB per context, training/plan/constants.CUDA_CONTEXT_GB, until a
calibration.json measures it), and another process may allocate between this reading and
vLLM's: 1 GiB, assumed, not measured.
Why a short-lived probe process: mem_get_info creates a CUDA context (~0.5 GB) that would stay
on every GPU asked about for the life of this process (a data or evaluation stage holds none).

    .venv/bin/pytest tests/test_gpu_memory.py -q
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass

GIB = 1024**3
MARGIN_GIB = 1.0

PROBE = (
    "import json, torch\n"
    "print(json.dumps([torch.cuda.mem_get_info(i) for i in range(torch.cuda.device_count())]))\n"
)


@dataclass(frozen=True)
class Share:
    """What one server asks for: `share` of `total` bytes with `free` bytes free at start."""

    devices: str  # the server's CUDA_VISIBLE_DEVICES
    configured: float
    share: float
    free: int  # the least free memory over the server's GPUs
    total: int

    @property
    def asked(self) -> float:
        return self.share * self.total

    def line(self) -> str:
        """One line: GPU, free, asked (the stage logs it; a failed start names it)."""
        lowered = "" if self.share == self.configured else f", lowered from {self.configured}"
        return (
            f"GPU {self.devices}: {self.free / GIB:.1f} GiB free of {self.total / GIB:.1f} GiB, "
            f"{self.asked / GIB:.1f} GiB asked (gpu_memory_utilization {self.share}{lowered})"
        )


def server_share(configured: float, free: int, total: int, margin: int) -> float:
    """min(configured, (free - margin) / total), floored to 0.001 (vLLM compares the product
    with free memory, so rounding up could ask for more than there is); 0.0 when nothing is left.
    server_share(0.85, 63.8 GiB, 79.2 GiB, 1 GiB) = 0.792."""
    room = (free - margin) / total
    return max(0.0, min(configured, math.floor(room * 1000) / 1000))


def probe(devices: list[str]) -> list[tuple[int, int]]:
    """(free, total) bytes of each physical GPU id in `devices`, read by mem_get_info() in a
    process of its own that sees exactly those GPUs, in that order."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(devices)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"reading GPU {','.join(devices)} memory failed: {done.stderr[-500:]}")
    return [tuple(pair) for pair in json.loads(done.stdout.strip().splitlines()[-1])]


def shares(configured: float, servers: list[str | None], margin_gib: float = MARGIN_GIB):
    """One Share per server (its CUDA_VISIBLE_DEVICES; None = the first visible GPU), over the
    least free of its GPUs; printed one line each. [] on a machine without GPUs."""
    from rcgrpo.rollout.router import visible_gpus

    visible = visible_gpus()
    if not visible:
        return []
    sets = [(d or visible[0]).split(",") for d in servers]
    ids = list(dict.fromkeys(g.strip() for s in sets for g in s))
    info = dict(zip(ids, probe(ids), strict=True))
    out = []
    for gpus in sets:
        free = min(info[g.strip()][0] for g in gpus)
        total = min(info[g.strip()][1] for g in gpus)
        share = server_share(configured, free, total, int(margin_gib * GIB))
        out.append(Share(",".join(g.strip() for g in gpus), configured, share, free, total))
        print(f"vLLM server memory: {out[-1].line()}", flush=True)
    return out


class ServerStartFailed(RuntimeError):
    """A vLLM server did not start; the message is one line: GPU, free and asked memory (on a
    GPU), the last error line of its log, and the log's path."""


def last_error(log_text: str) -> str:
    """The last exception line of a server's log ("ValueError: Free memory on device ..."),
    with the indented line after it when there is one (pydantic puts the reason there), without
    vLLM's "(APIServer pid=N)" prefix and skipping the wrappers that only point at the root
    cause ("Engine core initialization failed. See root cause above."); else its last line."""
    lines = [re.sub(r"^\(\w+ pid=\d+\)\s?", "", ln) for ln in log_text.splitlines()]
    lines = [ln for ln in lines if ln.strip()]
    found = [
        i
        for i, ln in enumerate(lines)
        if re.search(r"\b\w*(Error|Exception): ", ln) and "root cause above" not in ln
    ]
    if not found:
        return (lines or ["(empty log)"])[-1].strip()[-300:]
    i = found[-1]
    text = lines[i].strip()
    after = lines[i + 1] if i + 1 < len(lines) else ""
    if after[:1].isspace() and not after.strip().startswith(("raise ", "File ", "^")):
        text += " " + after.strip()
    return text[:400]


def start_failure(devices: str | None, share: Share | None, why: str, log_text: str, log) -> str:
    """The one line of a failed start: `why` (exit code, timeout), the GPU memory asked for
    (`share`: GPU, free, asked), the last error of the server's log, and the log."""
    where = share.line() if share is not None else f"GPU {devices}" if devices else "the CPU"
    return f"vLLM server on {where} did not start ({why}): {last_error(log_text)}; log {log}"
