"""Which Ray cluster a stage's Ray backend uses, and a private one that no other process joins.

`execution.address`:
  * `local` (default): a Ray cluster of this process alone (`ray.init(address="local")`), with
    token authentication whose token file is 0600 in a 0700 temporary folder (Ray's own default
    writes ~/.ray/auth_token world-readable, 0644), deleted when the stage ends;
  * `auto`: the cluster this node was told about on purpose: RAY_ADDRESS, else the one this
    user started with `ray start` (its address in /tmp/ray/ray_current_cluster), said in one log
    line; else a private one as above. Never what Ray's own "auto" also joins: any gcs_server
    found in `ps`, e.g. another user's or another run's private cluster. And the address file
    only when it is this user's own (`own_address_file`): /tmp/ray is world-writable, and
    another user who wrote it there had every rollout sent to his cluster;
  * `ray://host:10001` or `host:6379`: that cluster.

Ray listens on every interface even for a local cluster; the token is the barrier.

    with connect(ExecutionConfig(backend="ray"), runtime_env) as ray: ...
    .venv/bin/pytest tests/test_execution.py -q -k cluster
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import stat
import tempfile

OBJECT_STORE_BYTES = 512 * 2**20  # a local Ray started here: bounded shared memory (2-core box)
log = logging.getLogger(__name__)


def chosen_address(address: str) -> str | None:
    """The address `execution.address` means here; None = start a private cluster."""
    if address == "local":
        return None
    if address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env not in ("auto", "local"):
        return env
    from ray._common.utils import get_ray_address_file  # written by `ray start` only

    return own_address_file(get_ray_address_file(None))


def own_address_file(path: str) -> str | None:
    """The address in Ray's cluster file `path` if this user wrote it: a regular file (not a
    link: opened with O_NOFOLLOW, checked on the descriptor read), owned by this user and
    writable by no one else; else None, said in one log line."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("execution.address=auto: not reading %s (%s): a private cluster", path, e)
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            log.warning(
                "execution.address=auto: %s is not this user's own (uid %d, mode %o): not "
                "joining the cluster it names; starting a private one",
                path,
                st.st_uid,
                stat.S_IMODE(st.st_mode),
            )
            return None
        return f.read(4096).strip() or None


@contextlib.contextmanager
def private_token():
    """RAY_AUTH_MODE=token with a fresh token in a 0600 file (0700 folder) for a cluster started
    inside the block; the environment and the file are put back / removed after it."""
    folder = tempfile.mkdtemp(prefix="rcgrpo-ray-")  # mode 0700
    path = os.path.join(folder, "auth_token")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    keys = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=path, RAY_ADDRESS="local")
    _reload_auth()
    try:
        yield path
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        _reload_auth()
        shutil.rmtree(folder, ignore_errors=True)


def _reload_auth() -> None:
    """Ray reads RAY_AUTH_MODE and the token into its config when ray is imported; the
    processes it starts read the environment. Re-read both here, as Ray's own
    `_enable_token_auth` does, so this driver and its cluster agree (else: InvalidAuthToken)."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextlib.contextmanager
def connect(cfg, runtime_env: dict):
    """ray.init for one stage (joins or starts, per `chosen_address`); shut down after it if
    this started it. Yields the ray module."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    with contextlib.ExitStack() as stack:
        address = chosen_address(cfg.address)
        if address is not None:
            log.warning("execution.address=%s: joining the Ray cluster at %s", cfg.address, address)
            try:
                ray.init(address=address, runtime_env=runtime_env)
            except ConnectionError:
                if cfg.address != "auto":
                    raise
                log.warning("no Ray cluster answers at %s: starting a private one", address)
                address = None
        if address is None:
            stack.enter_context(private_token())
            # its session folder inside a 0700 folder of ours, not in /tmp/ray (0777, no sticky
            # bit: another user wrote into its logs and port files). Ray makes its own temp dir
            # 0777, so that is a subfolder; removed after shutdown
            private = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="rcgrpo-ray-", ignore_cleanup_errors=True)
            )
            temp = os.path.join(private, "ray")
            ray.init(
                address="local",
                num_cpus=max(2, cfg.workers),
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                runtime_env=runtime_env,
                _temp_dir=temp,
            )
        stack.callback(ray.shutdown)
        yield ray
