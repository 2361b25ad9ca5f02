"""Training checkpoints that resume exactly: trainable weights, optimizer, scheduler, RNGs, step.

Only parameters with requires_grad are stored (a LoRA run stores its adapter and the reward-token
rows, not the frozen base), so a checkpoint of a 7B LoRA run stays small. `load` restores them
into the same model object and puts every random generator back where it was, so on the CPU a
resumed run draws the same numbers as one that never stopped (tests/test_trainer.py checks it).
Files are written to a temporary folder and renamed: a crash never leaves half a checkpoint.
`state.pt` is read with `torch.load(weights_only=True)`: only tensors and plain containers load,
so a crafted checkpoint cannot run code (the RNG states are stored as tensors and lists for that;
tests/test_trainer.py has a pickle whose os.system payload must not run).

Each checkpoint also stores its run (rcgrpo.training.run_identity): the id of the run that wrote
it and a hash of its resolved config (in its run.json), so `--resume` never picks up another run's checkpoint.
torch is imported by the functions that read or write state: the folder ones (`latest`, `prune`)
also serve the pipeline's flow process, which never imports it.

    save(path, model, optimizer, scheduler, step, extra={"generator": gen.get_state()})
    state = load(latest(run_dir), model, optimizer, scheduler)   # -> {"step": ..., "extra": ...}
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from rcgrpo.runtime import replace_dir

if TYPE_CHECKING:
    import torch

PREFIX = "step_"
RUN_FILE = "run.json"  # in each checkpoint folder and in out_dir: {"run_id", "config_hash"}
NAME = re.compile(rf"{PREFIX}(\d+)")  # step_000040; a step_final or step_x folder is not ours


class CheckpointError(ValueError):
    """A checkpoint folder that is not one rcgrpo wrote (or holds more than tensors), or an
    output folder that cannot be written."""


def check_writable(out_dir: str | Path) -> Path:
    """Create `out_dir` and write+remove a probe file in it, before any training: an unwritable
    out_dir fails in a second instead of after the run (then nothing trained is lost)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".rcgrpo-write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise CheckpointError(
            f"out_dir {out} is not writable ({e.strerror or e}): pass --set out_dir=<a folder "
            "you can write>; nothing was trained"
        ) from None
    return out


def rng_state() -> dict:
    """Every generator's state as tensors / lists / numbers (what weights_only=True loads)."""
    import numpy as np
    import torch

    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": [version, list(words), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    version, words, gauss = state["python"]
    random.setstate((version, tuple(words), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable weights, copied straight to host memory: RL's rank 0 saves right after
    the weight sync has woken its vLLM server, so a copy on the GPU would sit beside the
    server's share on GPU 0 (15 GB for a full fine-tune of a 7B)."""
    return {
        n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad
    }


def save(
    path: str | Path,
    model,
    optimizer,
    scheduler,
    step: int,
    extra: dict | None = None,
    run: dict | None = None,
) -> Path:
    """Write <path> (a folder) holding state.pt; returns the folder. `run`: {"run_id",
    "config_hash"} of the run writing it (run_identity.begin)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    failed = None
    import torch

    try:
        torch.save(
            {
                "step": step,
                "model": trainable_state(model),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "rng": rng_state(),
                "extra": extra or {},
            },
            tmp / "state.pt",
        )
        if run:  # read before anything is loaded (run_identity.begin)
            (tmp / RUN_FILE).write_text(json.dumps(run))
    except (OSError, RuntimeError) as e:  # torch says "unexpected pos", not ENOSPC
        shutil.rmtree(tmp, ignore_errors=True)  # a partial .tmp would keep the disk full
        failed = _write_failed(path, e, model)
    if failed is not None:  # raised here, not in `except`: torch's open writer goes with `e`
        raise failed
    return replace_dir(tmp, path)


def _write_failed(path: Path, e: Exception, model) -> CheckpointError:
    """One line for a checkpoint that could not be written, saying when the disk is full."""
    free = shutil.disk_usage(path.parent).free
    weights = sum(p.nbytes for p in model.parameters() if p.requires_grad)
    full = getattr(e, "errno", None) == errno.ENOSPC or free < 3 * weights + 2**20
    why = "no space left on the disk" if full else "could not write"
    return CheckpointError(
        f"checkpoint {path}: {why} ({free / 2**20:.1f} MiB free under {path.parent}; "
        f"{(str(e).strip().splitlines() or [type(e).__name__])[0][:120]}); the partial "
        f"{path.name}.tmp was removed, earlier checkpoints are intact: free space or set "
        "out_dir on another disk, then --resume"
    )


def load(path: str | Path, model, optimizer=None, scheduler=None) -> dict:
    """Restore a checkpoint folder into live objects; returns {"step", "extra"}. A state.pt that
    is truncated, not a torch file, or misses a part fails in one line (CheckpointError) that
    names the folder and the earlier checkpoint to resume from, before anything is changed."""
    path = Path(path)
    if not (path / "state.pt").exists():
        raise FileNotFoundError(f"{path} holds no state.pt: not a checkpoint written by rcgrpo")
    import torch

    try:  # weights_only: a pickle that would import or call anything is refused, not run
        state = torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path / 'state.pt'} holds more than tensors and plain values, refused to load it "
            f"(not a checkpoint written by rcgrpo, or tampered with): {first}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as e:
        raise _unreadable(path, str(e) or type(e).__name__) from None
    parts = ("step", "model", "optimizer", "scheduler", "rng", "extra")
    if not isinstance(state, dict) or any(k not in state for k in parts):
        raise _unreadable(path, f"not the parts of an rcgrpo checkpoint {list(parts)}")
    params = dict(model.named_parameters())
    missing = sorted(set(state["model"]) - set(params))
    if missing:
        raise ValueError(f"{path}: checkpoint has parameters the model lacks: {missing[:5]}")
    with torch.no_grad():
        for name, tensor in state["model"].items():
            params[name].copy_(tensor)
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return {"step": state["step"], "extra": state["extra"]}


def _unreadable(path: Path, why: str) -> CheckpointError:
    steps = _steps(path.parent)
    earlier = steps[: steps.index(path)] if path in steps else steps
    then = f"to resume from {earlier[-1].name}" if earlier else "to start over"
    return CheckpointError(
        f"{path / 'state.pt'} is truncated or corrupt ({why.strip().splitlines()[0][:160]}): "
        f"move {path} away {then}; nothing was loaded"
    )


def _steps(folder: Path) -> list[Path]:
    """The step_<n> checkpoint folders holding a state.pt, by step (other names ignored)."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if NAME.fullmatch(p.name) and (p / "state.pt").is_file()]
    return sorted(found, key=lambda p: int(NAME.fullmatch(p.name).group(1)))


def latest(run_dir: str | Path) -> Path | None:
    """The checkpoint folder with the highest step under run_dir/checkpoints, or None."""
    found = _steps(Path(run_dir) / "checkpoints")
    return found[-1] if found else None


def path_for(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{PREFIX}{step:06d}"


def prune(run_dir: str | Path, keep: int, dry_run: bool = False) -> list[Path]:
    """Remove all but the `keep` highest-step checkpoints under run_dir/checkpoints, and the
    `checkpoints.old-*` folders earlier runs were moved aside to; returns what was (dry_run:
    would be) removed. keep 0 removes nothing. The latest (what `--resume` loads) is always kept; `final/` and any
    folder not named step_<n> (a best/exported copy) are never touched."""
    if keep <= 0:
        return []
    run_dir = Path(run_dir)
    doomed = _steps(run_dir / "checkpoints")[:-keep]
    doomed += sorted(p for p in run_dir.glob("checkpoints.old-*") if p.is_dir())
    for path in [] if dry_run else doomed:
        shutil.rmtree(path)
    return doomed
