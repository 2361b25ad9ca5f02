"""HTTP to a vLLM server on a Unix socket that only this user can reach.

Why not a TCP port on 127.0.0.1: a free port picked by the client and bound by the server
seconds later (its number on the server's command line, readable in /proc/*/cmdline) can be
taken by another local user in between; the client then sent him every prompt and the server's
key, and sampled his tokens and log-probs, even after the real server died with "Address
already in use". A socket in a folder of mode 0700 can be reached, and created, by this user
alone (the kernel checks the folder on connect), and no name is free for anyone to take: vLLM
binds it itself (`--uds`) in the server's own folder (rcgrpo.rollout.vllm_lifecycle.ipc_dir), and
the client checks the folder and the socket (`check_socket`) before its first request.

    conn = UnixHTTPConnection(path); conn.request("GET", "/health")
    .venv/bin/pytest tests/test_vllm_servers.py -q -k socket
"""

from __future__ import annotations

import http.client
import os
import socket
import stat
from pathlib import Path


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over the Unix socket at `path`."""

    def __init__(self, path: Path):
        super().__init__("localhost")
        self.path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:
            sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def check_socket(path: Path) -> None:
    """RuntimeError unless `path` is a socket of this user in a folder only this user can
    enter or write (the server's own, made by `vllm_lifecycle.ipc_dir`)."""
    folder, me = os.lstat(path.parent), os.getuid()
    if folder.st_uid != me or folder.st_mode & 0o077 or not stat.S_ISDIR(folder.st_mode):
        raise RuntimeError(f"vLLM socket folder {path.parent} is not a 0700 folder of yours")
    mine = os.lstat(path)
    if mine.st_uid != me or not stat.S_ISSOCK(mine.st_mode):
        raise RuntimeError(f"{path} is not a socket of yours: not sending it anything")
