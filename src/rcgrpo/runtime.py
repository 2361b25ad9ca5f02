"""Process defaults every entry point applies first: telemetry off, offline hubs, sane timeouts.

Called by the CLI, the flows and the test suite (never at import time: importing rcgrpo has no
side effects). Values already set in the environment win, so a user can override any of them.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULTS = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # 2 cores: the ephemeral Prefect server needs longer than its 20 s default to start.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}


def apply_defaults() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)
    # bfcl-eval writes result folders under its package dir unless told where the project is.
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(project_root() / "cache" / "bfcl"))


def project_root() -> Path:
    """The checkout this package runs from (where params.yaml lives), else the working dir."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "params.yaml").exists() and (parent / "pyproject.toml").exists():
            return parent
    return Path.cwd()
