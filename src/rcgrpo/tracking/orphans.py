"""What a killed pipeline left: its MLflow runs marked FAILED by the next run, and the state
`rcgrpo run --resume` continues it from.

Marked FAILED. A pipeline killed by SIGKILL (or a lost machine) never ends its MLflow runs, so
the UI showed them running forever. The next pipeline run holds the project's run lock
(rcgrpo.run_lock), so no other pipeline can be live: every RUNNING run tagged `stage=pipeline`,
and every RUNNING run below it, was left by a dead process. They get status FAILED and the tag
`rcgrpo.killed` (a resumed run reopens them: RUNNING again). A standalone `rcgrpo stage` run (no
pipeline parent) is never touched: it does not take the lock.

Resumed. The pipeline's state file, <project>/outputs/pipeline.json, names the last run started
in the project (its MLflow run id, its resolved config), the stages it completed (the data
version it built, the fine-tuned model) and the stage runs it started; `interrupted(rc)` reads
it back and refuses, in one line, a config that differs in a way that matters (naming the
setting), a fine-tuned model that is not the one the run saved (its recorded sha256: a standalone
`rcgrpo stage` wrote over it, and RL would resume against another reference) and a run with
nothing left to resume. A file of its own rather than MLflow's record: the killed run had no chance to record
anything, and what decides a skip is on disk: data/ still at the version the run built (DVC: not
dirty), the fine-tuned model's folder still whole. RL resumes from its own checkpoints
(rcgrpo.training.run_identity checks they are this run's). Settings that move no number may
differ: the rank count (N ranks make the 1-process update), where rollouts run (execution) and
what is traced (traces).

    fail_killed_pipelines()          # call with the run lock held; the ids it marked
    state = interrupted(rc)          # ConfigError in one line if there is nothing to resume
    .venv/bin/pytest tests/test_orphans.py tests/test_scale.py -q
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from rcgrpo.config import ConfigError
from rcgrpo.runtime import project_root
from rcgrpo.tracking.runs import EXPERIMENT, configure


def fail_killed_pipelines(experiment: str = EXPERIMENT) -> list[str]:
    """Mark every RUNNING pipeline run and its RUNNING descendants FAILED; their ids."""
    exp_id = configure(experiment=experiment)
    client = MlflowClient()
    running = "attributes.status = 'RUNNING'"
    todo = [
        r.info.run_id
        for r in client.search_runs([exp_id], f"{running} AND tags.stage = 'pipeline'")
    ]
    marked: list[str] = []
    while todo:
        run_id = todo.pop()
        marked.append(run_id)
        below = client.search_runs(
            [exp_id], f"{running} AND tags.`mlflow.parentRunId` = '{run_id}'"
        )
        todo += [r.info.run_id for r in below if r.info.run_id not in marked]
    for run_id in marked:
        client.set_tag(run_id, "rcgrpo.killed", "left RUNNING by a killed pipeline; marked FAILED")
        client.set_terminated(run_id, "FAILED")
    return marked


# -- resume ----------------------------------------------------------------------------------

STATE = Path("outputs") / "pipeline.json"
# settings a resumed run may change: they move no number (docs/scaling.md)
FREE = ("pipeline.procs", "pipeline.nodes", "pipeline.rendezvous", "execution.", "traces.")


def _path() -> Path:
    return project_root() / STATE


def _write(state: dict) -> None:
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str) + "\n")
    tmp.replace(path)  # a kill mid-write leaves the previous state, never half of one


def start(run_id: str, config: dict) -> dict:
    """A fresh pipeline run: the state names it, no stage done yet."""
    state = {"run_id": run_id, "config": config, "done": {}, "runs": {}}
    _write(state)
    return state


def record(state: dict, stage: str, info: dict, done: bool = True) -> None:
    """Stage `stage` finished (done) or started (its MLflow run, to be reopened on a resume).
    A stage done anew voids what was built on its earlier output: the stages recorded after it
    and the started runs (RL, always later). A finished stage's model is recorded with its
    digest (`model_digest`), which a resume checks."""
    if done:
        if "model_path" in info:
            info = {**info, "sha256": model_digest(info["model_path"])}
        stages = list(state["done"])
        kept = stages[: stages.index(stage)] if stage in stages else stages
        state["done"] = {k: state["done"][k] for k in kept} | {stage: info}
        state["runs"] = {}
    else:
        state["runs"][stage] = info
    _write(state)


def finished(state: dict) -> None:
    state["finished"] = True
    _write(state)


def flat(config: dict, prefix: str = "") -> dict:
    """{"rl": {"lr": 1e-4}} -> {"rl.lr": 1e-4}"""
    out: dict = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def differing(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """(setting, interrupted run's value, this run's) of every setting that matters and differs,
    sorted by name. Lists compare as lists (JSON turns tuples into lists)."""
    a, b = (
        flat(json.loads(json.dumps(old, default=str))),
        flat(json.loads(json.dumps(new, default=str))),
    )
    keys = sorted(set(a) | set(b))
    return [
        (k, a.get(k), b.get(k))
        for k in keys
        if a.get(k) != b.get(k) and not any(k == f or k.startswith(f) for f in FREE)
    ]


def interrupted(rc) -> dict:
    """The state of the run `--resume` continues; ConfigError in one line when there is none, it
    finished, or `rc` differs from its config in a setting that matters (the first, named)."""
    path = _path()
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"rcgrpo run --resume: no pipeline run to resume in this project ({path} does not "
            "exist); run without --resume"
        ) from None
    except ValueError as e:
        raise ConfigError(
            f"rcgrpo run --resume: {path} is unreadable ({e}); run without --resume"
        ) from None
    if state.get("finished"):
        raise ConfigError(
            f"rcgrpo run --resume: the last run here (MLflow run {state['run_id']}) finished; "
            "nothing to resume: run without --resume"
        )
    diff = differing(state["config"], rc.to_dict())
    if diff:
        key, was, now = diff[0]
        more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
        raise ConfigError(
            f"rcgrpo run --resume: {key} is {now!r} now but was {was!r} in the interrupted run "
            f"{state['run_id']}{more}; resume with its settings, or run without --resume"
        )
    for stage, info in state["done"].items():
        if _model(info) == "replaced":  # RL would resume against another reference
            raise ConfigError(
                f"rcgrpo run --resume: {info['model_path']} is not the {stage} model the "
                f"interrupted run {state['run_id']} trained (sha256 {info['sha256']} recorded, "
                f"{model_digest(info['model_path'])} now: another command replaced it); nothing "
                "to resume: run without --resume"
            )
    holds = [
        stage
        for stage, info in state["done"].items()
        if _model(info) == "whole" or (stage == "data" and data_complete(state))
    ]
    if not holds and not state["runs"]:
        raise ConfigError(
            f"rcgrpo run --resume: nothing to resume: the interrupted run {state['run_id']} "
            "left no finished stage that still holds (data/ at its version, its fine-tuned model) "
            "and no RL run; run without --resume"
        )
    return state


def data_complete(state: dict) -> bool:
    """The data stage finished and data/ is still the version it built (DVC: md5, not dirty)."""
    from rcgrpo.tracking import runs as tracking

    built = state["done"].get("data")
    if not built:
        return False
    now = tracking.data_version()
    return now["md5"] == built.get("md5") != "none" and now["dirty"] == "false"


def model_complete(state: dict, stage: str) -> dict | None:
    """The stage's {"run_id", "model_path", "config", "sha256"} when it finished and its saved
    model's folder is still whole and the one it saved; else None."""
    info = state["done"].get(stage)
    return info if info and _model(info) == "whole" else None


def _model(info: dict) -> str | None:
    """A finished stage's model now: "whole" (the policy file save_policy writes last is there,
    and the digest is the recorded one), "replaced" (whole, another digest), "gone"; None for a
    stage without a model (data)."""
    from rcgrpo.models.profiles import POLICY_FILE

    if "model_path" not in info:
        return None
    if not (Path(info["model_path"]) / POLICY_FILE).is_file():
        return "gone"
    if info.get("sha256") not in (None, model_digest(info["model_path"])):
        return "replaced"
    return "whole"


def model_digest(folder: str | Path) -> str:
    """sha256 (first 16 hex) of a saved model folder: each file's path and bytes, by path.
    Bytes, not dates: a standalone `rcgrpo stage` writing the same weights again is the same
    model. It reads the whole folder (the adapter and tokenizer of a LoRA policy: MBs)."""
    folder, digest = Path(folder), hashlib.sha256()
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(folder)).encode() + b"\0")
        with file.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]
