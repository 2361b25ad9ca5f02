"""A finished `rcgrpo run` looked at as a person would: its episodes found with
`mlflow.search_traces`, its report's trace links, and the MLflow UI in headless Chromium
(scripts/ui_check.py: the experiment page in the model-training view, the RL run's charts, a
successful and a failed episode with its tool calls), screenshots saved.

The pipeline runs with small sizes in a temporary copy of the project, fine-tuned long enough
(40 epochs on 4 tasks) that the policy makes tool calls and succeeds on some tasks. Chromium is
Debian's `chromium` package: installed here with apt-get when missing and running as root,
otherwise the test is skipped and says why. ~4-6 min on 2 cores; PNGs under the test's tmp dir.

The check killed while Chromium runs (SIGINT, SIGTERM, SIGHUP, or its parent killed): no Chromium
process, no profile and no MLflow UI are left, and no DevTools port was open (Chromium is driven
over a pipe; sandboxed unless root). ~30-60 s each, on a store holding one finished pipeline run.

    .venv/bin/pytest tests/test_ui_check.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_pipeline_e2e import copy_env, copy_project, run_in_copy
from test_servers import alive, descendants

from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow

SETS = [
    "dataset.train_tasks=4", "dataset.test_tasks=4", 'dataset.rollouts="off"', "rctp.epochs=40",
    "rl.steps=2", "rl.tasks_per_step=4", "rl.group_size=2", "rl.mini_batch_size=8",
    "rl.micro_batch_size=8", "eval.limit=1", "rollout.max_new_tokens=48",
    "rollout.max_total_tokens=1536", "rollout.max_steps=3", "traces.rl_every=1",
    "traces.rl_groups=0",
]  # fmt: skip


def test_finished_run_seen_in_the_ui(prefect_server, tmp_path, chromium):
    from mlflow.tracking import MlflowClient

    proj = copy_project(project_root(), tmp_path / "proj")
    code, text = run_in_copy(proj, "tiny", SETS, timeout=1200)
    assert code == 0, text[-5000:]
    assert "?workflowType=machine_learning" in text and "episode traces" in text

    # the RL run's episodes, found by task id (and reward / goal) with mlflow.search_traces
    uri = f"sqlite:///{proj}/mlflow/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rcgrpo")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    rl = runs["rl"]
    assert rl.data.metrics["traces/episodes"] == 2 * 4 * 2  # 2 steps x 4 groups x G = 2
    import mlflow

    previous, env_before = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)  # beats a URI an earlier test of this process set
    try:
        from rcgrpo.tracking.traces import find_traces

        tasks = json.loads((proj / "outputs" / "rl" / "tasks.json").read_text())
        for task in tasks:
            hits = find_traces(rl.info.run_id, task_id=task)
            assert len(hits) == 2 * 2, task  # its group at both steps
            assert {t.info.tags["rl_step"] for t in hits} == {"1", "2"}
            for t in hits:
                assert t.info.trace_metadata["mlflow.sourceRun"] == rl.info.run_id
                goal, reward = t.info.tags["goal"], t.info.tags["reward"]
                same = find_traces(rl.info.run_id, task_id=task, goal=goal, reward=reward)
                assert t.info.trace_id in {s.info.trace_id for s in same}
        after = runs["eval_rl_tasks_after"]
        evaluated = find_traces(after.info.run_id)  # every episode: each task under high and low
        assert len(evaluated) == after.data.metrics["traces/episodes"] > 0
        evaluated_tasks = {t.info.tags["task_id"] for t in evaluated}
        goals = [t.info.tags["goal"] for t in evaluated]
        assert goals.count("high") == goals.count("low") == len(evaluated_tasks)
    finally:
        mlflow.set_tracking_uri(previous)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if env_before is not None:
            os.environ["MLFLOW_TRACKING_URI"] = env_before

    # the report names, per RL task, a success and a failure before and after RL
    pipeline = runs["pipeline"]
    summary = (proj / "reports" / pipeline.info.run_id / "summary.md").read_text()
    assert "## Episodes of the RL tasks as MLflow traces" in summary
    rows = [ln for ln in summary.splitlines() if ln.startswith("| multi_turn_")]
    assert {ln.split(" | ")[0][2:] for ln in rows} == evaluated_tasks
    assert "selectedEvaluationId=tr-" in summary and "workflowType=machine_learning" in summary

    # the UI, as a person sees it
    shots = tmp_path / "ui"
    browsers_before = set(Path(tempfile.gettempdir()).glob("org.chromium.*"))
    check = subprocess.run([sys.executable, str(proj / "scripts" / "ui_check.py"), "--store",
                            str(proj / "mlflow"), "--out", str(shots)], cwd=proj, env=copy_env(proj),
                           capture_output=True, text=True, timeout=900)  # fmt: skip
    report = json.loads(check.stdout.strip().splitlines()[-1])
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    # the browser's temporary folders went with its profile, not left in the temp dir
    assert set(Path(tempfile.gettempdir()).glob("org.chromium.*")) <= browsers_before
    assert report["run_id"] == pipeline.info.run_id
    pages = report["pages"]
    assert {"experiment", "default_view", "rl_metrics", "trace_success", "trace_failure"} <= set(
        pages
    )
    assert pages["experiment"]["title"].startswith("Runs")  # the model-training view
    for name in pages:
        assert (shots / f"{name}.png").stat().st_size > 10_000, name
    trace_page = (shots / "trace_failure.txt").read_text()
    assert report["traces"]["failure"]["tool"] in trace_page
    print(json.dumps(report, indent=1))


@pytest.fixture(scope="module")
def one_run_store(tmp_path_factory) -> Path:
    """A real MLflow store holding experiment `rcgrpo` and one finished `pipeline` run."""
    from mlflow.tracking import MlflowClient

    store = tmp_path_factory.mktemp("ui_check_store")
    client = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db")
    run = client.create_run(client.create_experiment("rcgrpo"), run_name="pipeline")
    client.set_terminated(run.info.run_id, "FINISHED")
    return store


PARENT = "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()"  # a parent to kill


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _listening_inodes() -> set[str]:
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        rows += [ln.split() for ln in Path(table).read_text().splitlines()[1:]]
    return {f[9] for f in rows if f[3] == "0A"}  # 0A: LISTEN


def _sockets(pid: int) -> set[str]:
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return set()
    return {link[8:-1] for link in links if link.startswith("socket:[")}


@pytest.mark.parametrize("kill", ["SIGINT", "SIGTERM", "SIGHUP", "parent"])
def test_a_killed_ui_check_leaves_no_browser(chromium, one_run_store, tmp_path, kill):
    check = [sys.executable, str(project_root() / "scripts" / "ui_check.py"), "--store",
             str(one_run_store), "--out", str(tmp_path / "out")]  # fmt: skip
    cmd = [sys.executable, "-c", PARENT, *check] if kill == "parent" else check
    env = {**os.environ, "RCGRPO_CHROMIUM": chromium}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip
    try:
        browser, deadline = [], time.monotonic() + 240
        while not browser and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)  # the MLflow UI starts first, then the browser
            below = descendants(proc.pid)
            # the browser leads its own process group; a helper it forks carries the same
            # command line until it execs (or exits), so the flag alone can pick a passer-by
            browser = [
                p for p in below if _pgid(p) == p and "--remote-debugging-pipe" in _cmdline(p)
            ]
        assert browser, f"no Chromium started: {proc.poll()}"
        time.sleep(3)  # its helpers are up
        below = descendants(proc.pid)
        flags = _cmdline(browser[0])
        assert not [f for f in flags if f.startswith("--remote-debugging-port")], flags
        assert ("--no-sandbox" in flags) == (os.geteuid() == 0), flags  # sandboxed unless root
        profile = Path(next(f for f in flags if f.startswith("--user-data-dir=")).split("=", 1)[1])
        assert profile.is_dir() and profile.stat().st_mode & 0o077 == 0
        group = {p for p in below if _pgid(p) == browser[0]}  # the browser's process group
        assert len(group) > 1, group  # with its helpers (zygote, renderer, ...)
        open_ports = set().union(*(_sockets(p) for p in group)) & _listening_inodes()
        assert not open_ports, f"Chromium listens on a TCP port ({len(open_ports)} sockets)"
        if kill == "parent":
            proc.kill()  # the check's parent dies; the check gets SIGTERM (PR_SET_PDEATHSIG)
            proc.wait()
            check_pid = next(p for p in below if _cmdline(p)[1:2] == check[1:2])
            deadline = time.monotonic() + 60
            while alive({check_pid}) and time.monotonic() < deadline:
                time.sleep(0.2)
        else:
            proc.send_signal(getattr(signal, kill))
            out = proc.communicate(timeout=60)[0]
            assert proc.returncode == 128 + getattr(signal, kill), out[-2000:]
    finally:
        for pid in alive(descendants(proc.pid)) | ({proc.pid} if proc.poll() is None else set()):
            os.kill(pid, signal.SIGKILL)
        proc.wait()
    assert not alive(below), f"left running: {[_cmdline(p)[:2] for p in alive(below)]}"
    assert not profile.exists(), sorted(p.name for p in profile.iterdir())
