"""Run the dataset's Great Expectations suite (suite.yaml) over a built dataset folder.

Every JSONL file becomes one pandas frame, one row per line, with the raw fields plus derived
check columns (`frame`). A line that is not JSON or does not fit the Trajectory schema becomes a
row with `schema_error` set, so it fails an expectation with its line number instead of aborting
the read. GX runs in ephemeral mode (nothing written to a GX project); Data Docs go to
`docs_dir` (outside data/, so they never enter a dataset version).

    .venv/bin/python -m rcgrpo.data.validation data      # exit 1 and the failures if invalid
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rcgrpo.chat.record import SPLITS, RecordError, from_dict
from rcgrpo.data.failures import api_calls
from rcgrpo.data.labels import goal_counts, token_for
from rcgrpo.rollout.environment import Environment

SUITE_FILE = Path(__file__).with_name("suite.yaml")
FILES = ("rctp/train.jsonl", "rctp/test.jsonl", "sft/train.jsonl", "sft/test.jsonl")


class ValidationFailed(RuntimeError):
    """The suite failed; the message names each failed expectation, file and lines."""

    def __init__(self, report: ValidationReport):
        self.report = report
        super().__init__(report.message())


@dataclass
class Failure:
    file: str
    expectation: str
    column: str
    risk: str
    rows: list[dict]  # {"line", "task_id", "value"} of the offending rows (empty: aggregate)
    observed: object = None  # aggregate expectations: the observed value

    def describe(self) -> str:
        where = f"{self.file}: {self.expectation}({self.column}) failed — {self.risk}"
        if not self.rows:
            return f"{where}; observed {self.observed!r}"
        shown = ", ".join(
            f"line {r['line']} ({r['task_id']}: {r['value']!r})" for r in self.rows[:10]
        )
        more = f" and {len(self.rows) - 10} more" if len(self.rows) > 10 else ""
        return f"{where}; rows: {shown}{more}"


@dataclass
class ValidationReport:
    success: bool
    failures: list[Failure] = field(default_factory=list)
    evaluated: int = 0  # expectations run, over all files
    docs_dir: str = ""

    def message(self) -> str:
        if self.success:
            return f"dataset valid: {self.evaluated} expectations passed"
        return "dataset validation failed:\n" + "\n".join(
            f"  - {f.describe()}" for f in self.failures
        )


def _row(path: Path, number: int, line: str, kind: str, split_of: dict, env: Environment) -> dict:
    """One JSONL line as flat check columns; its calls checked by the environment's parser."""
    base = {"file": path.name, "line": number, "file_split": path.stem, "schema_error": None}
    try:
        record = from_dict(json.loads(line), f"{path}:{number}")
    except json.JSONDecodeError as e:
        return {**base, "schema_error": f"not valid JSON ({e.msg} at column {e.colno})"}
    except RecordError as e:
        return {**base, "schema_error": str(e)}
    calls = [c for turn in record.calls for step in turn for c in step]
    bad_calls = sum(env.check_call(text) is not None for text in calls)
    if kind == "rctp":
        label_ok = record.reward_token == token_for(record.reward)
    else:  # the SFT set: experts only, no token
        label_ok = record.reward_token is None and record.reward == 1
    total, first = goal_counts(record.messages)
    empty = sum(
        1
        for m in record.messages
        if m["role"] == "assistant"
        and not (m.get("content") or "").strip()
        and not m.get("tool_calls")
    )
    # A low row must show a failure *of tool calling*: at least one dispatched call (done() aside).
    no_call = record.reward == 0 and not api_calls(record)
    return {
        **base,
        "task_id": record.task_id,
        "category": record.category,
        "split": record.split,
        "task_split": split_of.get(record.task_id, "not in the split file"),
        "protocol": record.protocol,
        "generator": record.provenance.generator,
        "reward": record.reward,
        "reward_token": record.reward_token or "none",
        "label_ok": bool(label_ok),
        "is_high": float(record.reward == 1),
        "goal_total": total,
        "goal_first": first,
        "bad_calls": bad_calls,
        "empty_assistant": empty,
        "low_without_call": bool(no_call),
    }


COLUMNS = [
    "file",
    "line",
    "file_split",
    "schema_error",
    "task_id",
    "category",
    "split",
    "task_split",
    "protocol",
    "generator",
    "reward",
    "reward_token",
    "label_ok",
    "is_high",
    "goal_total",
    "goal_first",
    "bad_calls",
    "empty_assistant",
    "low_without_call",
]


def frame(path: Path, kind: str, env: Environment):
    """The check frame of one JSONL file of `env`'s tasks (pandas DataFrame, one row per
    non-blank line)."""
    import pandas as pd

    split_of = {t.id: split for split in SPLITS for t in env.tasks(split)}
    rows = [
        _row(path, n, line, kind, split_of, env)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if line.strip()
    ]
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.astype({"schema_error": object})


def parameters(high_share: float, tolerance: float) -> dict:
    return {
        "high_share_min": high_share - tolerance,
        "high_share_max": high_share + tolerance,
        "columns": list(COLUMNS),
    }


def load_suite(params: dict, path: Path = SUITE_FILE) -> list[dict]:
    """suite.yaml's expectations with "$name" values filled in from `params`."""
    entries = yaml.safe_load(path.read_text())["expectations"]
    for entry in entries:
        for key, value in entry["kwargs"].items():
            if isinstance(value, str) and value.startswith("$"):
                entry["kwargs"][key] = params[value[1:]]
    return entries


def _gx_expectation(entry: dict, index: int):
    import great_expectations as gx

    cls = "".join(part.capitalize() for part in entry["type"].split("_"))
    # meta carries the suite index back: GX does not return results in suite order.
    return getattr(gx.expectations, cls)(**entry["kwargs"], meta={"suite_index": index})


def validate_dir(
    folder: str | Path,
    env: Environment,
    high_share: float = 0.5,
    tolerance: float = 0.05,
    docs_dir=None,
) -> ValidationReport:
    """Run the suite over every dataset file of `env`'s tasks in `folder`; Data Docs to
    `docs_dir` if given."""
    import great_expectations as gx

    folder = Path(folder)
    context = gx.get_context(mode="ephemeral")
    # GX's per-expectation tqdm bars would drown the flow's own progress lines.
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    if docs_dir:
        Path(docs_dir).mkdir(parents=True, exist_ok=True)
        context.update_data_docs_site(
            "local_site",
            {
                "class_name": "SiteBuilder",
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(Path(docs_dir).resolve()),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
    source = context.data_sources.add_pandas("dataset")
    entries = load_suite(parameters(high_share, tolerance))
    report = ValidationReport(True, docs_dir=str(docs_dir or ""))
    for rel in FILES:
        path = folder / rel
        kind = rel.split("/")[0]
        if not path.exists():
            report.success = False
            report.failures.append(
                Failure(rel, "file_exists", "-", "a dataset file is missing", [], None)
            )
            continue
        df = frame(path, kind, env)
        name = rel.replace("/", "_").replace(".jsonl", "")
        batch_def = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe(name)
        suite = context.suites.add(gx.ExpectationSuite(name=name))
        for index, entry in enumerate(entries):
            if kind in entry["applies_to"]:
                suite.add_expectation(_gx_expectation(entry, index))
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=name, data=batch_def, suite=suite)
        )
        actions = [gx.checkpoint.UpdateDataDocsAction(name="docs")] if docs_dir else []
        checkpoint = context.checkpoints.add(
            gx.Checkpoint(
                name=name,
                validation_definitions=[definition],
                actions=actions,
                result_format={"result_format": "COMPLETE"},
            )
        )
        result = checkpoint.run(batch_parameters={"dataframe": df})
        run = next(iter(result.run_results.values()))
        report.evaluated += len(run.results)
        for res in run.results:
            if res.success:
                continue
            entry = entries[res.expectation_config.meta["suite_index"]]
            report.success = False
            report.failures.append(_failure(rel, entry, res.result, df))
    return report


def _failure(rel: str, entry: dict, result: dict, df) -> Failure:
    kwargs = entry["kwargs"]
    column = kwargs.get("column") or f"{kwargs.get('column_A')}={kwargs.get('column_B')}"
    rows = []
    for index in result.get("unexpected_index_list") or []:
        row = df.loc[index]
        value = (
            row[kwargs["column"]]
            if "column" in kwargs
            else (f"{row[kwargs['column_A']]} vs {row[kwargs['column_B']]}")
        )
        if kwargs.get("column") == "schema_error":
            value = row["schema_error"]
        rows.append({"line": int(row["line"]), "task_id": row["task_id"], "value": value})
    return Failure(rel, entry["type"], column, entry["risk"], rows, result.get("observed_value"))


if __name__ == "__main__":
    from rcgrpo.runtime import apply_defaults

    apply_defaults()
    from rcgrpo.envs import get  # the import of the entry point alone: params.yaml `env:`

    outcome = validate_dir(sys.argv[1] if len(sys.argv) > 1 else "data", get())
    print(outcome.message())
    sys.exit(0 if outcome.success else 1)
