"""Which Ray cluster the Ray backend uses, with real Ray clusters: another
process's private cluster is running; Ray's own `address="auto"` finds it in `ps` and joins it
(what `execution.address: auto` did), ours does not; the private cluster we start has its token
in a 0600 file (Ray's default writes ~/.ray/auth_token with mode 0644), removed afterwards.

~30-60 s on 2 cores (two Ray clusters start): marked slow.

    .venv/bin/pytest tests/test_ray_cluster.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from rcgrpo.runtime import project_root

pytestmark = pytest.mark.slow

OTHER = """
import os, ray, sys, time
ray.init(address="local", num_cpus=1, include_dashboard=False, object_store_memory=80 * 2**20,
         _temp_dir=os.path.join(sys.argv[1], "ray"))  # not /tmp/ray: it would be left there
print(ray.get_runtime_context().gcs_address, flush=True)
time.sleep(600)
"""

OURS = """
import json, os, stat
from ray._private.services import get_ray_address_from_environment
from rcgrpo.rollout.execution import ExecutionConfig
from rcgrpo.rollout.ray_cluster import connect

seen = {"ray_auto": get_ray_address_from_environment("auto", None)}  # what Ray's auto joins
with connect(ExecutionConfig(backend="ray", address="auto"), {}) as ray:
    seen["joined"] = ray.get_runtime_context().gcs_address
    token = os.environ["RAY_AUTH_TOKEN_PATH"]
    seen["token_mode"] = oct(stat.S_IMODE(os.stat(token).st_mode))
    seen["folder_mode"] = oct(stat.S_IMODE(os.stat(os.path.dirname(token)).st_mode))
    seen["auth_mode"] = os.environ["RAY_AUTH_MODE"]
    seen["task"] = ray.get(ray.remote(lambda: 41 + 1).remote())
seen["token_left"] = os.path.exists(token)
seen["home_token"] = os.path.exists(os.path.expanduser("~/.ray/auth_token"))
print(json.dumps(seen))
"""


def test_auto_never_joins_another_processs_private_cluster(tmp_path):
    if os.path.exists("/tmp/ray/ray_current_cluster"):
        pytest.skip("a `ray start` cluster runs on this host: `auto` joins it on purpose")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"HOME": str(tmp_path), "PYTHONPATH": str(project_root() / "src"),
            "RAY_USAGE_STATS_ENABLED": "0"}  # fmt: skip
    other_home = tmp_path / "other"  # Ray's defaults, as another user's run would have them
    temp = tempfile.mkdtemp(prefix="rcgrpo-ray-")  # short: Ray's socket paths fit in 107 bytes
    other = subprocess.Popen([sys.executable, "-c", OTHER, temp],
                             env={**env, "HOME": str(other_home)}, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        held = other.stdout.readline().strip()
        assert held, "the other process's cluster did not start"
        default_token = other_home / ".ray" / "auth_token"  # Ray's default: world-readable
        assert default_token.stat().st_mode & 0o777 == 0o644
        out = subprocess.run([sys.executable, "-c", OURS], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    finally:
        other.kill()
        other.wait()
        subprocess.run([sys.executable, "-c", "import ray; ray.shutdown()"], env=env, timeout=60)
        shutil.rmtree(temp, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["ray_auto"] == held  # Ray's own auto would have joined it
    assert seen["joined"] != held and seen["task"] == 42
    assert seen["token_mode"] == "0o600" and seen["folder_mode"] == "0o700"
    assert seen["auth_mode"] == "token" and not seen["token_left"] and not seen["home_token"]
