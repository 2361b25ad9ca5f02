"""The constants `rcgrpo plan` assumes, and one GPU's measurements in their place.

`Assumed` holds every value the plan's table marks "assumed" (rcgrpo.training.plan.constants,
plus the shared-prefix update's MFU), each with where it comes from. `load(path)` reads a
calibration.json, written by `dump` from scripts/gpu_day_one.sh, and returns the Assumed with
each measured value in place of its constant; a constant the run could not measure (vLLM's,
on a machine without vLLM) stays assumed, with the run's reason beside it. The file's keys are
the constants' names, so a figure can be traced to the line it replaces.

    scripts/gpu_day_one.sh --out cache/day-one     # on a GPU: writes cache/day-one/calibration.json
    rcgrpo plan --preset paper --profile qwen2.5-7b-instruct --calibration cache/day-one/calibration.json
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from rcgrpo.training.plan import constants as C

SCHEMA = "rcgrpo-calibration/1"
# the file's key (the constant's name) -> (Assumed field, bounds (low, high], what it is)
FIELDS = {
    "MFU": ("mfu", (0, 1), "model FLOPs utilisation of the update (padded rows)"),
    "MFU_SHARED": ("mfu_shared", (0, 1), "model FLOPs utilisation of the shared-prefix update"),
    "PREFILL_EFF": ("prefill_eff", (0, 1), "prefill / decode matmul efficiency"),
    "BANDWIDTH_EFF": ("bandwidth_eff", (0, 1), "decode bandwidth efficiency"),
    "ITERATION_S": ("iteration_s", (0, 1), "engine iteration overhead, s"),
    "CHUNK_TOKENS": ("chunk_tokens", (0, 1e7), "tokens per engine iteration"),
    "SYNC_S": ("sync_s", (0, 3600), "weight sync per step, s"),
    "CUDA_CONTEXT_GB": ("cuda_context_gb", (0, 100), "CUDA context per process, GB"),
    "NCCL_GB": ("nccl_gb", (0, 100), "NCCL buffers per trainer (> 1 GPU), GB"),
    "ALLOCATOR_SLACK": ("allocator_slack", (-0.001, 10), "allocator slack, share"),
    "VLLM_NON_TORCH_GB": ("vllm_non_torch_gb", (0, 100), "vLLM non-torch memory, GB"),
    "VLLM_OVERHEAD_GB": ("vllm_overhead_gb", (0, 100), "vLLM activations + CUDA graphs, GB"),
}


@dataclass(frozen=True)
class Assumed:
    """The plan's assumed values; `measured` maps a field to the source of its measurement,
    `why` a field left assumed to the reason a calibration run gave."""

    mfu: float = C.MFU
    mfu_shared: float = C.MFU
    prefill_eff: float = C.PREFILL_EFF
    bandwidth_eff: float = C.BANDWIDTH_EFF
    iteration_s: float = C.ITERATION_S
    chunk_tokens: float = C.CHUNK_TOKENS
    sync_s: float = C.SYNC_S
    cuda_context_gb: float = C.CUDA_CONTEXT_GB
    nccl_gb: float = C.NCCL_GB
    allocator_slack: float = C.ALLOCATOR_SLACK
    vllm_non_torch_gb: float = C.VLLM_NON_TORCH_GB
    vllm_overhead_gb: float = C.VLLM_OVERHEAD_GB
    measured: dict = dataclasses.field(default_factory=dict)
    why: dict = dataclasses.field(default_factory=dict)
    origin: str = ""  # the calibration it came from, one line; "" = the constants as they are
    kind: str | None = None  # the measured GPU's key in constants.GPUS (None: another device)

    def source(self, name: str) -> str:
        """'measured ...' or 'assumed' (with the calibration's reason where it gave one)."""
        if name in self.measured:
            return self.measured[name]
        return f"assumed ({self.why[name]})" if name in self.why else "assumed"

    def given(self, name: str, value: float, option: str) -> Assumed:
        """This with `name` set by a command-line option (e.g. --mfu)."""
        measured = {**self.measured, name: f"given ({option})"}
        return dataclasses.replace(self, **{name: value}, measured=measured)


ASSUMED = Assumed()  # the constants as constants.py states them


def _fail(path, what: str):
    from rcgrpo.config import ConfigError

    raise ConfigError(f"calibration {path}: {what}; write it with scripts/gpu_day_one.sh --out DIR")


def _number(path, key: str, entry) -> float | None:
    """A constant's value (None: not measured), checked against its bounds."""
    if not isinstance(entry, dict) or "value" not in entry:
        _fail(path, f"constants.{key} must be an object with a 'value'")
    value = entry["value"]
    if value is None:
        if not isinstance(entry.get("why"), str):
            _fail(path, f"constants.{key} has no value and no 'why'")
        return None
    low, high = FIELDS[key][1]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low < value <= high:
        _fail(path, f"constants.{key}.value {value!r} is not a number in ({low:g}, {high:g}]")
    return float(value)


def load(path: str | Path) -> Assumed:
    """The Assumed of a calibration.json: its measured values in place of the constants."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"calibration {path}: no such file") from None
    except (OSError, ValueError) as e:
        _fail(path, f"not a JSON file ({type(e).__name__}: {str(e)[:80]})")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        _fail(path, f"schema must be {SCHEMA!r}")
    constants, device = data.get("constants"), data.get("device")
    if not isinstance(constants, dict) or not isinstance(device, dict):
        _fail(path, "needs 'constants' and 'device' objects")
    if unknown := sorted(set(constants) - set(FIELDS)):
        _fail(path, f"unknown constants {unknown}")
    if missing := sorted(set(FIELDS) - set(constants)):
        _fail(path, f"constants {missing} missing (each a value, or null with a 'why')")
    where = f"{device.get('name', '?')}, {data.get('date', '?')}"
    where += ", CPU smoke run" if data.get("smoke") else ""
    values, measured, why = {}, {}, {}
    for key, entry in constants.items():
        field = FIELDS[key][0]
        value = _number(path, key, entry)
        if value is None:
            why[field] = entry["why"]
        else:
            values[field] = value
            measured[field] = f"measured ({where}: {path.name})"
    origin, kind = f"{path} ({where})", device.get("kind")
    return dataclasses.replace(
        ASSUMED, **values, measured=measured, why=why, origin=origin, kind=kind
    )


def dump(
    path: str | Path,
    measured: dict[str, tuple[float, str]],
    not_measured: dict[str, str],
    device: dict,
    cases: list[dict],
    smoke: bool,
    command: str,
    date: str,
) -> Path:
    """Write a calibration.json: measured {KEY: (value, how)}, not_measured {KEY: why}; every
    key of FIELDS must be in one of them. Written whole or not at all (a temporary file
    renamed), then read back through `load` so a bad value fails here, not in the plan."""
    keys = set(measured) | set(not_measured)
    if keys != set(FIELDS):
        raise ValueError(f"calibration keys {sorted(keys ^ set(FIELDS))}: each must be given once")
    constants = {k: {"value": v, "how": how} for k, (v, how) in measured.items()}
    constants |= {k: {"value": None, "why": why} for k, why in not_measured.items()}
    data = {
        "schema": SCHEMA,
        "date": date,
        "command": command,
        "smoke": smoke,
        "device": device,
        "constants": {k: constants[k] for k in FIELDS},
        "cases": cases,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    load(path)
    return path
