"""Another local user who takes a server's port: for the port-race tests.

`Squatter` is an HTTP listener run as user nobody (`setpriv`, when the tests run as root; else
as this user) that binds each port it is told about as fast as it can, answers every request
200 and reports what it was sent (method, path, Authorization header). `watch(root, squatter)`
reads the command lines of the processes below `root` and hands it every `--port N` they name:
what another user can read in /proc/*/cmdline before the server binds.

    with Squatter() as s:
        s.take(port)        # or watch(pid, s) in a thread
        ...
        assert s.seen() == []
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def other_user() -> list[str]:
    """The argv prefix that runs a command as another user: nobody when this is root with
    setpriv, else nothing (the same user: the client's own checks are still what is tested)."""
    return NOBODY if os.geteuid() == 0 and shutil.which("setpriv") else []


def as_other_user(argv: list[str], env: dict) -> tuple[list[str], dict]:
    """(argv, env) running the Python command `argv` (argv[0] = sys.executable) as another user
    (`other_user`). This venv's interpreter may lie where nobody can enter (a pyenv under
    /root), so his runs the system's Python of the same version with this venv's packages and
    src/ on PYTHONPATH; unchanged when there is no other user."""
    if not other_user():
        return argv, env
    python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(python):
        return argv, env
    paths = [str(Path(__file__).parents[1] / "src"), sysconfig.get_paths()["purelib"]]
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [*other_user(), python, *argv[1:]], {**env, "PYTHONPATH": os.pathsep.join(paths)}


SERVER = r"""
import http.server, json, socket, sys, threading, time

class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        print(json.dumps({"method": self.command, "path": self.path,
                          "auth": self.headers.get("Authorization"),
                          "body": body[:200].decode("latin-1")}), flush=True)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')
    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer
    def log_message(self, *a):
        pass

def take(port):
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError:
            time.sleep(0.001)
            continue
        print(json.dumps({"took": port}), flush=True)
        return server.serve_forever()
    print(json.dumps({"missed": port}), flush=True)

for line in sys.stdin:
    threading.Thread(target=take, args=(int(line),), daemon=True).start()
"""


class Squatter:
    def __init__(self):
        argv, env = as_other_user([sys.executable, "-c", SERVER], dict(os.environ))
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        self.lines: list[dict] = []
        self.asked: set[int] = set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def take(self, port: int) -> None:
        if port not in self.asked and self.proc.poll() is None:
            self.asked.add(port)
            try:
                self.proc.stdin.write(f"{port}\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):  # it was stopped meanwhile
                pass

    def took(self) -> list[int]:
        return [x["took"] for x in self.lines if "took" in x]

    def seen(self) -> list[dict]:
        """The requests it was sent."""
        return [x for x in self.lines if "method" in x]

    def __enter__(self) -> Squatter:
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.1)  # a watcher's last hand-over
        self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=5)


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(p))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def ports_named(pid: int) -> list[int]:
    """The `--port N` / `--port=N` of the command line of `pid`."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
    out = []
    for i, a in enumerate(argv):
        if a == "--port" and i + 1 < len(argv) and argv[i + 1].isdigit():
            out.append(int(argv[i + 1]))
        elif a.startswith("--port=") and a[7:].isdigit():
            out.append(int(a[7:]))
    return out


def watch(root: int, squatter: Squatter, stop: threading.Event) -> threading.Thread:
    """A thread that hands `squatter` every port named on a command line below `root`."""

    def loop() -> None:
        while not stop.is_set():
            for pid in descendants(root):
                for port in ports_named(pid):
                    squatter.take(port)
            time.sleep(0.02)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread
