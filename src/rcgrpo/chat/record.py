"""The typed record of one multi-turn trajectory, and its JSONL reader/writer.

One JSON object per line. `read_jsonl` rejects a malformed row with its line number and the field
at fault (nothing is skipped silently); `write_jsonl` writes to a temporary file and renames it,
so a crash never leaves a half-written file in place of a good one.

    from rcgrpo.chat.record import read_jsonl
    rows = read_jsonl("data/rctp/train.jsonl")
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

HIGH, LOW = "<|high_reward|>", "<|low_reward|>"
REWARD_TOKENS = (HIGH, LOW)
PROTOCOLS = ("bfcl", "combined")
SPLITS = ("train", "test")
MAX_ROW_BYTES = 4 << 20  # a record is a few kB; an 8 MB row once cost 2 GB before it was dropped


class RecordError(ValueError):
    """A trajectory row that does not fit the schema; says which line and which field."""


@dataclass
class Provenance:
    generator: str  # "expert" | "rollout" | "perturbation:<kind>" | ...
    model: str = ""  # model id or path that produced it ("" for the ground truth)
    seed: int | None = None
    created_at: str = ""  # ISO-8601 UTC


@dataclass
class Trajectory:
    """One multi-turn trajectory with its rewards.

    messages: chat messages in order; an assistant message may carry `tool_calls` (list of call
        strings) and tool observations are messages with role "tool".
    calls: per turn, per model step, the executed python-call strings (bfcl-eval's result layout).
    paper_reward / bfcl_reward: 0 or 1, with the checkers' reasons in `reward_reason`.
    """

    task_id: str
    category: str
    split: str
    protocol: str
    messages: list[dict]
    calls: list[list[list[str]]]
    paper_reward: int
    bfcl_reward: int
    provenance: Provenance
    reward_token: str | None = None
    reward_reason: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)


_REQUIRED = {
    f.name for f in fields(Trajectory) if f.default is MISSING and f.default_factory is MISSING
}


def _expect(cond: bool, where: str, fieldname: str, what: str) -> None:
    if not cond:
        raise RecordError(f"{where}: field {fieldname!r} {what}")


def from_dict(row: dict, where: str = "row") -> Trajectory:
    """Validate one decoded row and build the record; RecordError names the field at fault."""
    _expect(isinstance(row, dict), where, "<row>", "must be a JSON object")
    missing = sorted(_REQUIRED - row.keys())
    _expect(not missing, where, ",".join(missing), "is missing")
    unknown = sorted(row.keys() - {f.name for f in fields(Trajectory)})
    _expect(not unknown, where, ",".join(unknown), "is not a Trajectory field")
    for name in ("task_id", "category"):
        _expect(isinstance(row[name], str) and row[name], where, name, "must be a non-empty string")
    _expect(
        row["split"] in SPLITS, where, "split", f"must be one of {SPLITS}, got {row['split']!r}"
    )
    _expect(
        row["protocol"] in PROTOCOLS,
        where,
        "protocol",
        f"must be one of {PROTOCOLS}, got {row['protocol']!r}",
    )
    _expect(
        row.get("reward_token") in (None, *REWARD_TOKENS),
        where,
        "reward_token",
        f"must be null or one of {REWARD_TOKENS}, got {row.get('reward_token')!r}",
    )
    for name in ("paper_reward", "bfcl_reward"):
        _expect(
            row[name] in (0, 1) and not isinstance(row[name], float),
            where,
            name,
            f"must be 0 or 1, got {row[name]!r}",
        )
    _expect(
        isinstance(row["messages"], list)
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str | None)
            for m in row["messages"]
        ),
        where,
        "messages",
        "must be a list of objects with a 'role' and a string (or null) 'content'",
    )
    calls = row["calls"]
    _expect(
        isinstance(calls, list)
        and all(
            isinstance(turn, list)
            and all(
                isinstance(step, list) and all(isinstance(c, str) for c in step) for step in turn
            )
            for turn in calls
        ),
        where,
        "calls",
        "must be turns -> steps -> call strings",
    )
    prov = row["provenance"]
    _expect(
        isinstance(prov, dict) and isinstance(prov.get("generator"), str),
        where,
        "provenance",
        "must be an object with a 'generator' string",
    )
    try:
        provenance = Provenance(**prov)
    except TypeError as e:
        raise RecordError(f"{where}: field 'provenance' {e}") from None
    _expect(
        isinstance(row.get("reward_reason", {}), dict), where, "reward_reason", "must be an object"
    )
    return Trajectory(**{**row, "provenance": provenance})


def read_jsonl(path: str | Path) -> list[Trajectory]:
    """All records of a JSONL file; the first bad line raises RecordError with its number."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trajectory file {path} does not exist")
    records = []
    with path.open("rb") as handle:  # bytes: the size and the encoding checked per row
        for number, raw in enumerate(handle, start=1):
            where = f"{path}:{number}"
            _expect(
                len(raw) <= MAX_ROW_BYTES,
                where,
                "<row>",
                f"is {len(raw) / 2**20:.1f} MiB, above the {MAX_ROW_BYTES >> 20} MiB limit",
            )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RecordError(f"{where}: not UTF-8 (byte {e.start + 1}: {e.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(
                    f"{where}: not valid JSON ({e.msg} at column {e.colno})"
                ) from None
            except ValueError as e:  # a number of over 4,300 digits (int() refuses to convert)
                raise RecordError(f"{where}: not a record ({' '.join(str(e).split())})") from None
            except RecursionError:
                raise RecordError(f"{where}: JSON nested too deep to be a record") from None
            records.append(from_dict(row, where))
    return records


def write_jsonl(path: str | Path, records: list[Trajectory]) -> Path:
    """Write records atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            for record in records:
                handle.write(record.to_json() + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_task_ids(records: list[Trajectory], where: str | Path) -> list[Trajectory]:
    """RecordError in one line if a record names a task BFCL does not have (it failed with a
    KeyError after the model had loaded); returns the records."""
    from rcgrpo.bfcl.tasks import load_tasks

    known = load_tasks()
    for number, record in enumerate(records, start=1):
        if record.task_id not in known:
            raise RecordError(f"{where}: record {number}: unknown task id {record.task_id[:80]!r}")
    return records
