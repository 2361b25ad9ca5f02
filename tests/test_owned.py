"""What another local user can no longer do to a project's runs (rcgrpo.owned), each probe run as
that user (uid 65534 through `setpriv`, where the tests run as root) against the real calls:

  * hold the run lock or the build lock (flock needs only read access to the file), so that
    every run, prune and build is refused naming a dead pid;
  * plant a 3,000-deep folder under the vLLM ipc sweep's name in the temp dir (RecursionError at
    every vLLM start), or have the sweep touch anything of theirs;
  * spoof the "vLLM server left behind" warning with a process whose command line carries the
    servers' mark;
  * read the MLflow or Prefect database.

And for the user alone: a served base left by a killed run is swept at the next run, and a folder
of any depth of the user's own is removed without recursion. ~1 min (one Prefect server start).

    .venv/bin/pytest tests/test_owned.py -q
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rcgrpo.owned import NotOwned, private_dir, remove_tree, sweep_dead

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
PYTHON = "/usr/bin/python3"  # one `nobody` can run (the venv may sit in a folder of root's)
DEAD = int(Path("/proc/sys/kernel/pid_max").read_text())  # no process ever has this pid

other_user = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.access(PYTHON, os.X_OK),
    reason="needs root, setpriv and /usr/bin/python3 to run the probe as another user",
)


def as_nobody(code: str, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [*AS_NOBODY, PYTHON, "-c", code, *args], stdout=subprocess.PIPE, text=True, **kw
    )


@pytest.fixture
def shared():
    """A folder another user can enter (as a project in a home folder of 0755 is): not pytest's
    tmp_path, whose 0700 parents would stop the probe before anything of ours does."""
    folder = Path(tempfile.mkdtemp(prefix="rcgrpo-probe-"))
    folder.chmod(0o1777)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=True)  # any depth, anyone's


# -- locks ------------------------------------------------------------------------------------

HOLD_ALL = """
import fcntl, glob, os, sys, time
held = []
for path in glob.glob(sys.argv[1] + "/**/*.lock", recursive=True):
    try:
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.append(path)
    except OSError:
        pass
print(len(held), flush=True)
time.sleep(120)
"""

TAKE_RUN_LOCK = "import sys; from rcgrpo.run_lock import hold; hold(sys.argv[1]); print('held')"


@other_user
def test_another_user_cannot_hold_the_run_or_build_lock(shared):
    from rcgrpo.data.journal import build_lock

    project = shared / "proj"
    project.mkdir(mode=0o755)
    for folder in (project, project / ".dvc"):
        folder.mkdir(mode=0o755, exist_ok=True)
    taken = subprocess.run(
        [sys.executable, "-c", TAKE_RUN_LOCK, str(project)], capture_output=True, text=True
    )
    assert taken.stdout.strip() == "held", taken.stderr[-2000:]  # the lock files now exist
    with build_lock(project, timeout=0):
        pass
    probe = as_nobody(HOLD_ALL, str(project))
    try:
        print(f"lock files another user holds: {probe.stdout.readline().strip()}")
        again = subprocess.run(
            [sys.executable, "-c", TAKE_RUN_LOCK, str(project)], capture_output=True, text=True
        )
        assert again.stdout.strip() == "held", again.stderr[-2000:]
        with build_lock(project, timeout=0):
            pass
    finally:
        probe.kill()
        probe.wait()
    locks = project / "cache" / "locks"
    assert locks.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in locks.glob("*.lock")} == {0o600}


def test_a_lock_folder_someone_else_made_is_refused_in_one_line(tmp_path):
    """A symlink where the lock folder goes is followed only when it is the user's own."""
    from rcgrpo.run_lock import hold

    (tmp_path / "cache").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "cache" / "locks")
    (tmp_path / "elsewhere").mkdir(mode=0o755)
    hold(tmp_path)  # the user's own link to a folder of theirs: made 0700 and used
    assert (tmp_path / "elsewhere").stat().st_mode & 0o777 == 0o700
    (tmp_path / "file").write_text("")
    with pytest.raises(NotOwned, match="must be a folder of yours, but it is not a folder"):
        private_dir(tmp_path / "file")


@other_user
def test_a_folder_of_another_user_is_not_taken_as_ours(shared):
    subprocess.run([*AS_NOBODY, "mkdir", "-m", "0777", str(shared / "theirs")], check=True)
    with pytest.raises(NotOwned, match=rf"belongs to uid {NOBODY}, not to you") as e:
        private_dir(shared / "theirs")
    assert "\n" not in str(e.value)


# -- sweeps -----------------------------------------------------------------------------------

PLANT = """
import os, sys
os.chdir(sys.argv[1])
for _ in range(3000):
    os.mkdir("d")
    os.chdir("d")
print("planted", flush=True)
"""


@other_user
def test_the_ipc_sweep_skips_a_deep_folder_another_user_planted(shared, monkeypatch):
    from rcgrpo.rollout.vllm_lifecycle import IPC_PREFIX, ipc_dir

    planted = shared / f"{IPC_PREFIX}{DEAD}-planted"
    subprocess.run([*AS_NOBODY, "mkdir", str(planted)], check=True)
    done = as_nobody(PLANT, str(planted))
    assert done.stdout.readline().strip() == "planted"
    done.wait()
    ours = shared / f"{IPC_PREFIX}{DEAD}-ours"  # a dead server's own sockets folder
    (ours / "sub").mkdir(parents=True)
    (ours / "sub" / "sock").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    fresh = ipc_dir()  # raised RecursionError before, at every vLLM start on the machine
    assert fresh.parent == shared and fresh.is_dir()
    assert planted.is_dir() and planted.stat().st_uid == NOBODY  # not ours: left alone
    assert not ours.exists()  # a dead owner's of ours: swept


def test_remove_tree_takes_any_depth_without_recursion(tmp_path):
    """A tree deeper than the recursion limit (1,000 frames) goes; a symlink in it is removed,
    never followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    top = here = tmp_path / "top"
    top.mkdir()
    for _ in range(1500):  # 1500 x "/d": past the recursion limit, within PATH_MAX
        here = here / "d"
        here.mkdir()
    (here / "link").symlink_to(outside)
    assert remove_tree(top) and not top.exists()
    assert (outside / "keep").read_text() == "kept"


def test_a_killed_runs_served_base_is_swept_at_the_next_run(tmp_path, monkeypatch):
    """`rcgrpo run` exports its served base into outputs/served-<host>-<pid>/; a kill -9 runs no
    `finally`, so the next run on this host removes what a dead pid of this host left (a live
    one's, and another node's on a shared outputs/, stay)."""
    from rcgrpo.models.serving import node_bases

    outputs = tmp_path / "outputs"
    here = f"served-{socket.gethostname()}-"
    left = outputs / f"{here}{DEAD}" / "0123abcd"
    left.mkdir(parents=True)
    (left / "model.safetensors").write_bytes(b"\0" * 1024)
    kept = [outputs / f"{here}{os.getppid()}", outputs / f"served-another-node-{DEAD}"]
    for folder in kept:
        folder.mkdir()
    monkeypatch.setenv("RCGRPO_PROJECT", str(tmp_path))
    monkeypatch.delenv("RCGRPO_SERVED_DIR", raising=False)
    with node_bases() as folder:  # what `rcgrpo run` and each torchrun launch enter
        assert folder.name == f"{here}{os.getpid()}"
        assert not (outputs / f"{here}{DEAD}").exists()
        assert all(k.is_dir() for k in kept)
    assert sweep_dead(outputs, here) == []  # nothing dead of this host is left


# -- the leftover-server warning ----------------------------------------------------------------


@other_user
def test_another_users_process_is_no_leftover_server(shared):
    from rcgrpo.rollout import vllm_lifecycle

    script = f"{PYTHON} -c 'import time; time.sleep(120)' --middleware {vllm_lifecycle.MARK}"
    out = subprocess.run(
        [*AS_NOBODY, "sh", "-c", f"{script} >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
        cwd=shared,
    )
    pid = int(out.stdout.split()[-1])
    try:
        deadline = time.monotonic() + 10  # until its shell is gone (no Python parent above it)
        while "python" in vllm_lifecycle._cmdline(vllm_lifecycle._ppid(pid)):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert pid not in vllm_lifecycle.leftovers()  # nobody's process, not ours to name
    finally:
        os.kill(pid, signal.SIGKILL)


# -- the stores ---------------------------------------------------------------------------------

READ = "import sys; open(sys.argv[1], 'rb').read(16); print('read')"
# what every `rcgrpo stage` and pipeline does first: open the project's MLflow store; here each
# process waits at a start line (a file) after its imports, so that they open it together
CONFIGURE = """
import os, sys, time
from pathlib import Path
from rcgrpo.tracking.runs import configure
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
print(configure(Path(sys.argv[1])), flush=True)
"""


def open_store_together(project: Path, n: int) -> list[subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    go = project / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONFIGURE, str(project), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(n)
    ]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
    go.write_text("")
    outs = [p.communicate(timeout=300) for p in procs]
    return [
        subprocess.CompletedProcess(p.args, p.returncode, *o)
        for p, o in zip(procs, outs, strict=True)
    ]


def test_processes_opening_a_fresh_store_together_all_get_it(tmp_path):
    """Two standalone `rcgrpo stage` on a fresh checkout both created the MLflow tables, and one
    died in alembic (a 285-line traceback): the store is created under a lock in its folder."""
    done = open_store_together(tmp_path, 3)
    bad = [p.stderr.strip().splitlines()[-1:] for p in done if p.returncode]
    assert not bad, bad
    assert len({p.stdout.strip() for p in done}) == 1  # the one experiment, made once


@other_user
def test_another_user_cannot_read_the_mlflow_store(shared):
    project = shared / "proj"
    project.mkdir(mode=0o755)
    (done,) = open_store_together(project, 1)
    assert done.returncode == 0, done.stderr[-2000:]
    db = project / "mlflow" / "mlflow.db"
    assert db.stat().st_size > 0  # MLflow's tables are there
    assert (db.parent.stat().st_mode & 0o777, db.stat().st_mode & 0o777) == (0o700, 0o600)
    probe = as_nobody(READ, str(db), stderr=subprocess.PIPE)
    out, err = probe.communicate(timeout=60)
    assert "read" not in out and "PermissionError" in err


@other_user
def test_another_user_cannot_read_the_prefect_database(shared, monkeypatch):
    from rcgrpo.flow_server import private_prefect

    home = shared / "prefect-home"
    home.mkdir(mode=0o755)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    with private_prefect(log_dir=shared / "logs"):
        db = home / "prefect.db"
        assert db.stat().st_size > 0  # the server made its tables
        modes = (home.stat().st_mode & 0o777, db.stat().st_mode & 0o777)
        probe = as_nobody(READ, str(db), stderr=subprocess.PIPE)
        out, err = probe.communicate(timeout=60)
    assert modes == (0o700, 0o600)
    assert "read" not in out and "PermissionError" in err
