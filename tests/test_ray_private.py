"""The private Ray cluster keeps its session folder (logs, port files, sockets) in a 0700
folder of its own, not in /tmp/ray (0777 without a sticky bit, where another local user
injected a console line and replaced a port file), and removes it after shutdown. One real
Ray cluster: ~20-40 s on 2 cores.

    .venv/bin/pytest tests/test_ray_private.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow

PROBE = """
import json, os, stat
from rcgrpo.rollout.execution import ExecutionConfig
from rcgrpo.rollout.ray_cluster import connect

with connect(ExecutionConfig(backend="ray", address="auto"), {}) as ray:
    session = ray._private.worker._global_node.get_session_dir_path()
    top = os.path.dirname(os.path.dirname(session))  # ours: Ray makes the one below 0777
    seen = {"session": session, "mode": oct(stat.S_IMODE(os.stat(top).st_mode)),
            "task": ray.get(ray.remote(lambda: 41 + 1).remote())}
seen["left"] = os.path.exists(top)
print(json.dumps(seen))
"""


def test_private_cluster_session_folder_is_ours_alone(tmp_path):
    if os.path.exists("/tmp/ray/ray_current_cluster"):
        pytest.skip("a `ray start` cluster runs on this host: `auto` joins it on purpose")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {
        "HOME": str(tmp_path),
        "PYTHONPATH": str(project_root() / "src"),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["task"] == 42 and not seen["session"].startswith("/tmp/ray/")
    assert "rcgrpo-ray-" in seen["session"] and seen["mode"] == "0o700"
    assert not seen["left"]
