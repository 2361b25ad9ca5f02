"""Hostile and faulty inputs from the command line: each fails at once in one line,
before any work, and loses nothing already saved.

    .venv/bin/pytest tests/test_hardening.py -q
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
from test_cli_pipeline import cpu_seconds

RCGRPO = [sys.executable, "-m", "rcgrpo.cli"]


def cli(*args, cwd=None, env=None):
    env = {**os.environ, "COLUMNS": "400", **(env or {})}
    return subprocess.run([*RCGRPO, *args], capture_output=True, text=True, timeout=300, env=env,
                          cwd=cwd)  # fmt: skip


def one_line_error(out, says: str) -> None:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    assert says in lines[0], lines[0]


# -- 7: an unwritable out_dir fails before training; a failed save keeps the old final/ -------


def test_unwritable_out_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "a_file"  # root can write any folder: a file in the path stops it too
    blocker.write_text("")
    out_dir = blocker / "rctp"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = cli("stage", "rctp", "--set", f"out_dir={out_dir}")
    one_line_error(out, f"out_dir {out_dir} is not writable")
    assert "nothing was trained" in out.stderr and "step 1" not in out.stdout
    assert cpu_seconds(before) < 60  # CPU, not wall time: 83 s of wall at load 26


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder anyway")
def test_read_only_out_dir_fails_before_training(tmp_path):
    out_dir = tmp_path / "ro"
    out_dir.mkdir(mode=0o500)
    one_line_error(cli("stage", "sft", "--set", f"out_dir={out_dir}"), "is not writable")


def test_a_failed_save_keeps_the_previous_final(tmp_path, monkeypatch):
    from rcgrpo.models.loading import load_policy, save_policy
    from rcgrpo.models.profiles import ModelConfig

    policy = load_policy(ModelConfig())
    final = save_policy(policy, tmp_path / "final", {"stage": "rctp"})
    before = {p.name: p.read_bytes() for p in final.iterdir()}

    def no_space(*a, **k):  # ENOSPC mid-save cannot be caused for real in a test
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(policy.tokenizer, "save_pretrained", no_space)
    with pytest.raises(OSError, match="No space"):
        save_policy(policy, final, {"stage": "rctp", "again": True})
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before  # untouched, whole
    monkeypatch.undo()
    save_policy(policy, final, {"stage": "rl"})  # the next save replaces it by a rename
    assert json.loads((final / "rcgrpo_policy.json").read_text())["training"] == {"stage": "rl"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no temp folder left


# -- 9: one-line errors instead of tracebacks --------------------------------------------------


def test_env_run_calls_on_a_binary_file_or_a_directory(tmp_path):
    binary = tmp_path / "calls.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    for path, says in ((binary, "is not a UTF-8 text file"), (tmp_path, "is a directory")):
        out = cli("env", "run", "multi_turn_base_0", "--calls", str(path))
        assert out.returncode == 2 and "Traceback" not in out.stderr and says in out.stderr


def test_a_corrupt_jsonl_row_is_one_line_with_its_line_number(tmp_path):
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import write_jsonl
    from rcgrpo.envs.bfcl.experts import expert

    data = tmp_path / "rctp.jsonl"
    write_jsonl(data, [expert(t, "combined") for t in tasks_in("train")[:2]])
    data.write_text(data.read_text() + '{"task_id": "multi_turn_base_0", "turns": [tru\n')
    out = cli("stage", "rctp", "--set", f"data={data}", "--set", f"out_dir={tmp_path / 'out'}")
    one_line_error(out, f"{data}:3: not valid JSON")


def test_eval_on_a_missing_path(tmp_path):
    out = cli("stage", "eval", "--model", str(tmp_path / "nope"))
    one_line_error(out, f"{tmp_path / 'nope'} is not a folder")


@pytest.mark.parametrize(
    "text", ["", "outs:\n- md5: 0123", "outs:\n- md5: [", "outs:\n- path: d\n"]
)
def test_an_empty_or_truncated_data_dvc(tmp_path, text):
    """`data versions` says so in one line; an MLflow run still starts, tagged 'unreadable'."""
    from mlflow import MlflowClient

    from rcgrpo.tracking import runs as tracking

    root = tmp_path / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / "data.dvc").write_text(text)
    out = cli("data", "versions", "--root", str(root))
    one_line_error(out, "data.dvc is empty or truncated")
    warned = pytest.warns(UserWarning, match="data version not recorded")
    with warned, tracking.start_run("probe", root=root) as run:
        pass
    tags = MlflowClient().get_run(run.info.run_id).data.tags
    assert tags["data.md5"] == "unreadable" and tags["data.version"] == "unreadable:unreadable"


# -- a truncated state.pt or a folder named step_final on --resume ---------


def _checkpoints(out_dir):
    """step_000001 (whole), step_000002 (state.pt cut in half, as a full disk leaves it) and a
    folder named step_final, as a user might copy one there."""
    import torch

    from rcgrpo.training import checkpoint

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    runs = out_dir / "checkpoints"
    for step in (1, 2):
        checkpoint.save(checkpoint.path_for(out_dir, step), model, opt, None, step)
    state = runs / "step_000002" / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    (runs / "step_final").mkdir()
    (runs / "step_final" / "state.pt").write_bytes(b"not a checkpoint")
    return model, opt


def test_a_truncated_checkpoint_is_one_line_naming_the_earlier_one(tmp_path):
    from rcgrpo.training import checkpoint

    model, opt = _checkpoints(tmp_path)
    last = checkpoint.latest(tmp_path)  # step_final is not a step: ignored, no ValueError
    assert last.name == "step_000002"
    with pytest.raises(checkpoint.CheckpointError, match=r"truncated or corrupt.*step_000001"):
        checkpoint.load(last, model, opt)
    assert checkpoint.load(tmp_path / "checkpoints" / "step_000001", model, opt)["step"] == 1


def test_resume_on_a_truncated_checkpoint_through_the_cli(tmp_path):
    """Was a traceback (RuntimeError from torch's zip reader, or ValueError for step_final)."""
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import write_jsonl
    from rcgrpo.envs.bfcl.experts import expert

    data = tmp_path / "rctp.jsonl"
    write_jsonl(data, [expert(t, "combined") for t in tasks_in("train")[:2]])
    out_dir = tmp_path / "out"
    _checkpoints(out_dir)
    ckpt = out_dir / "checkpoints" / "step_000002"
    out = cli(
        "stage",
        "rctp",
        "--resume-from",
        str(ckpt),
        "--set",
        f"data={data}",
        "--set",
        f"out_dir={out_dir}",
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]  # after the model's loading bar
    assert last.startswith("error: ") and "step_000002/state.pt is truncated or corrupt" in last
    assert "to resume from step_000001; nothing was loaded" in last
