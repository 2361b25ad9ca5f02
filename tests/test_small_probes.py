"""Smaller probes, each through the call a user hits: a YAML alias bomb in params fails at once
in one line (it hung the CLI while printing the error), and a dataset publish prints no DVC
"git add data.dvc" hint (the pipeline commits data.dvc itself). ~15 s.

    .venv/bin/pytest tests/test_small_probes.py -q
"""

from __future__ import annotations

import logging

import pytest
from test_hardening import cli
from test_versioning import built, make_project

from rcgrpo.config import ConfigError, read_params

# 9 levels of 9 aliases: 387M leaves once expanded, 1.2 kB on disk
BOMB = (
    "a: &a [x,x,x,x,x,x,x,x,x]\n"
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
    + "train: {rl: *i}\n"
)


def test_yaml_alias_bomb_is_refused_in_one_line(tmp_path):
    bomb = tmp_path / "params.yaml"
    bomb.write_text(BOMB)
    assert len(BOMB) < 1500
    with pytest.raises(ConfigError, match=r"YAML aliases \(\*a\) are not accepted"):
        read_params(bomb)
    out = cli("stage", "rl", "--params", str(bomb))
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "aliases" in last and len(last) < 400


def test_publish_prints_no_git_add_hint(tmp_path):
    from rcgrpo.data.publishing import publish

    root = make_project(tmp_path / "proj")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler, dvc_log = Keep(logging.INFO), logging.getLogger("dvc")
    level = dvc_log.level
    dvc_log.addHandler(handler)
    dvc_log.setLevel(logging.INFO)
    try:
        publish(built(root, 0)[0], root)
    finally:
        dvc_log.removeHandler(handler)
        dvc_log.setLevel(level)
    assert not [m for m in seen if "To track the changes with git" in m], seen


def test_tool_memory_above_the_hard_limit_is_one_line():
    """Under `ulimit -v` 8 GiB, env.tool_memory_mb=16384 failed every tool call (397 lines)."""
    import os
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    cmd = [sys.executable, "-m", "rcgrpo.cli", "plan", "--set", "env.tool_memory_mb=16384"]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit,
        env={**os.environ, "COLUMNS": "400"},
    )
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode != 0 and len(lines) == 1, out.stderr[-2000:]
    assert "above this process's hard address-space limit of 8192 MiB" in lines[0]


def test_full_disk_at_a_checkpoint_is_one_line_and_leaves_no_tmp(tmp_path):
    """A real full disk: a 64 kB tmpfs as out_dir (mounting needs root; skipped otherwise)."""
    import os
    import shutil
    import subprocess

    from test_run_identity import _cfg
    from test_sft import examples, tiny_model

    from rcgrpo.training.checkpoint import CheckpointError
    from rcgrpo.training.sft import train_sft

    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a tiny tmpfs as the full disk")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)])
    if mounted.returncode:
        pytest.skip("this container may not mount a tmpfs")
    try:
        with pytest.raises(CheckpointError) as failed:
            train_sft(tiny_model(), examples(8), _cfg(disk, save_every=1))
        line = str(failed.value)
        assert "\n" not in line and "no space left on the disk" in line and str(disk) in line
        assert not list(disk.rglob("*.tmp")), list(disk.rglob("*"))
    finally:
        import gc

        gc.collect()  # torch's writer of the failed save holds its (deleted) file until then
        subprocess.run(["umount", str(disk)], check=True)


def _dict_content(line: bytes) -> bytes:
    import json

    row = json.loads(line)
    row["messages"][0]["content"] = {"x": 1}
    return json.dumps(row).encode() + b"\n"


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda line: line[:40] + b"\xff\xfe" + line[40:], "not UTF-8"),
        (lambda line: b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deep"),
        (_dict_content, "string (or null) 'content'"),
        (lambda line: line[:-2] + b', "pad": "' + b"x" * (5 << 20) + b'"}\n', "MiB limit"),
        (lambda line: line[:-2] + b', "n": ' + b"9" * 5000 + b"}\n", "4300 digits"),
    ],
)
def test_bad_jsonl_rows_fail_in_one_line_naming_the_row(tmp_path, spoil, says):
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import RecordError, read_jsonl, write_jsonl
    from rcgrpo.envs.bfcl.experts import expert

    path = write_jsonl(
        tmp_path / "rctp.jsonl", [expert(t, "combined") for t in tasks_in("train")[:2]]
    )
    first, second = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(first + spoil(second))
    with pytest.raises(RecordError) as bad:
        read_jsonl(path)
    line = str(bad.value)
    assert "\n" not in line and f"{path}:2" in line and says in line, line[:300]


def test_unknown_task_id_fails_in_one_line_before_the_model_loads(tmp_path):
    import json

    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import write_jsonl
    from rcgrpo.envs.bfcl.experts import expert

    path = write_jsonl(
        tmp_path / "rctp.jsonl", [expert(t, "combined") for t in tasks_in("train")[:2]]
    )
    first, second = path.read_text().splitlines()
    row = json.loads(second)
    row["task_id"] = "multi_turn_base_99999"
    path.write_text(first + "\n" + json.dumps(row) + "\n")
    out = cli("stage", "rctp", "--set", f"data={path}", "--set", f"out_dir={tmp_path / 'out'}")
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode != 0 and len(lines) == 1, out.stderr[-2000:]
    assert "record 2: unknown task id 'multi_turn_base_99999'" in lines[0]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'{\n "pipeline": "\xff\xfe"}', "line 2: byte 0xff is not UTF-8"),
        (b'{"pipeline": ' + b"9" * 5000 + b"}", "4300 digits"),
    ],
)
def test_bad_run_config_files_fail_in_one_line(tmp_path, content, says):
    """`rcgrpo stage NAME --config FILE` (what DVC and every torchrun rank run) and
    `--params FILE`: a file that is not UTF-8, or holds a number of 5,000 digits, ended in a
    traceback."""
    from test_hardening import one_line_error

    bad = tmp_path / "run.json"
    bad.write_bytes(content)
    out = cli("stage", "rctp", "--config", str(bad))
    one_line_error(out, f"--config {bad}: ")
    assert says in out.stderr
    if b"\xff" in content:  # params.yaml, read by every command
        (tmp_path / "params.yaml").write_bytes(b"rl:\n  lr: \xff\n")
        out = cli("stage", "rctp", "--params", str(tmp_path / "params.yaml"))
        one_line_error(out, f"{tmp_path / 'params.yaml'}: line 2: byte 0xff is not UTF-8")


def test_alias_bomb_in_a_committed_data_dvc_is_one_line(tmp_path):
    """`rcgrpo data rollback REV` to a commit whose data.dvc is a 300-byte YAML alias bomb (8
    levels of 9: 43M leaves once expanded). The refusal printed the expanded `outs` and hung;
    now the file is refused unread above 64 kB, and its aliases at parse time, in one line,
    before anything is touched."""
    from test_rollback_remotes import _commit
    from test_versioning import git

    from rcgrpo.data.publishing import publish
    from rcgrpo.data.rollback import rollback
    from rcgrpo.data.versioning import VersioningError, file_md5s

    root = make_project(tmp_path / "proj")
    publish(built(root, 0)[0], root)
    before = file_md5s(root / "data")
    names = "abcdefgh"
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{b}: &{b} [{','.join(['*' + a] * 9)}]\n"
        for a, b in zip(names[:-1], names[1:], strict=True)
    )
    bomb += "outs: *h\n"
    assert len(bomb) < 320
    crafted = _commit(root, {"data.dvc": bomb}, "bomb")
    big = _commit(root, {"data.dvc": "outs: []\n" + "#" * 70_000 + "\n"}, "big")
    git(root, "reset", "-q", "--hard", "HEAD~2")
    for rev, says in ((crafted, "YAML aliases (*a) are not accepted"), (big, "70,010 bytes")):
        with pytest.raises(VersioningError) as refused:
            rollback(rev, root)
        message = str(refused.value)
        assert says in message and "Nothing was changed" in message, message[:400]
        assert "\n" not in message and len(message) < 400
    assert file_md5s(root / "data") == before
