"""Which run a checkpoint belongs to: `begin` starts a fresh run (a new run id; earlier
checkpoints moved aside, kept) or checks that `--resume` continues the run that wrote the
latest checkpoint, with the same resolved config.

Why: out_dir is reused across runs. Before, a fresh run into an out_dir holding an older run's
step_000006, killed after step 1, resumed the *older* run on `--resume` (0 steps trained, its
weights saved as the new run's final). Now <out_dir>/run.json names the run that started last
there, each checkpoint's run.json names the run that wrote it, and a resume refuses, in one
line, a checkpoint of another run or a config whose hash differs. `--resume-from PATH` loads
the named checkpoint without these checks (the user has said which one).

    ckpt, run = begin(cfg.out_dir, dataclasses.asdict(cfg), resume)   # resume: bool | path
    checkpoint.save(path, model, optimizer, scheduler, step, run=run)
    .venv/bin/pytest tests/test_run_identity.py -q
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from pathlib import Path

from rcgrpo.training.checkpoint import RUN_FILE, CheckpointError, latest


def config_hash(config: dict) -> str:
    """sha256 (first 16 hex) of the resolved config as sorted JSON."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def begin(
    out_dir: str | Path, config: dict, resume: bool | str | Path = False, main: bool = True
) -> tuple[Path | None, dict]:
    """(checkpoint to load or None, this run's {"run_id", "config_hash"}). `resume`: False (a
    fresh run), True (the latest checkpoint, checked) or a checkpoint folder (unchecked).
    Only the `main` process moves or writes anything."""
    out, digest = Path(out_dir), config_hash(config)
    if resume not in (False, True):  # --resume-from PATH: the user named it
        ckpt = Path(resume)
        if not (ckpt / "state.pt").is_file():
            raise CheckpointError(f"--resume-from {ckpt}: no state.pt there, not a checkpoint")
        run = {"run_id": _read(ckpt / RUN_FILE).get("run_id") or uuid.uuid4().hex[:12]}
        return ckpt, _started(out, run | {"config_hash": digest}, main)
    if resume and (ckpt := latest(out)) is not None:
        mine, theirs = _read(out / RUN_FILE), _read(ckpt / RUN_FILE)
        if not theirs or theirs.get("run_id") != mine.get("run_id"):
            raise CheckpointError(
                f"--resume: {ckpt} was written by run {theirs.get('run_id', '(unknown)')}, not by "
                f"{mine.get('run_id', '(none)')}, the run last started in {out}; pass "
                f"--resume-from {ckpt} to continue from it anyway, or drop --resume"
            )
        if theirs.get("config_hash") != digest:
            raise CheckpointError(
                f"--resume: {ckpt} was written with another config (hash "
                f"{theirs.get('config_hash')}, now {digest}); resume with the same settings, "
                f"or pass --resume-from {ckpt} to continue from it anyway"
            )
        return ckpt, theirs
    if main and not resume:
        old = out / "checkpoints"
        if old.is_dir() and any(old.iterdir()):  # kept, out of the way of this run's
            old.rename(
                out / f"checkpoints.old-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
            )
    return None, _started(out, {"run_id": uuid.uuid4().hex[:12], "config_hash": digest}, main)


def _started(out: Path, run: dict, main: bool) -> dict:
    if main:
        out.mkdir(parents=True, exist_ok=True)
        (out / RUN_FILE).write_text(json.dumps(run) + "\n")
    return run
