"""The project's own error types, which end every command in one line: `error: <message>`.

A bad `--set`, a corrupt JSONL row, a failed rollback, a refused checkpoint, a stage that failed
or a vLLM server that did not start say everything a user needs in their message; anything else
is a bug and keeps its traceback (rcgrpo.cli.main). `rcgrpo stage` writes the same line into its
result.json for the flow that started it.

    .venv/bin/pytest tests/test_cli_pipeline.py -q -k one_line
"""

from __future__ import annotations

import sys

# "module:Class" of the error types whose message is the whole story for a user; looked up only
# in modules the command already imported (catching must not import torch or dvc).
USER_ERRORS = (
    "rcgrpo.config:ConfigError",
    "rcgrpo.data.versioning:VersioningError",
    "rcgrpo.training.checkpoint:CheckpointError",
    "rcgrpo.chat.record:RecordError",
    "rcgrpo.servers:ServerError",
    "rcgrpo.run_lock:RunLocked",
    "rcgrpo.owned:NotOwned",
    "rcgrpo.data.objects:ObjectError",
    "builtins:FileNotFoundError",
    "rcgrpo.training.plan.memory:NoFit",
    "rcgrpo.training.rendezvous:Refused",
    "rcgrpo.training.grpo.exchange:ExchangeError",
    "rcgrpo.tracking.stage_process:StageFailed",
    "rcgrpo.rollout.gpu_memory:ServerStartFailed",
    "rcgrpo.training.grpo.sync_probe:StaleEngine",
)


def user_error(exc: BaseException) -> str | None:
    """The one-line message of a project error, None for anything else (a bug)."""
    for spec in USER_ERRORS:
        module, name = spec.split(":")
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None and isinstance(exc, cls):
            text = " ".join(str(exc).split()) or type(exc).__name__
            return text
    return None
