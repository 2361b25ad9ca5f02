"""Headless Chromium driven over the DevTools protocol through a pipe, for scripts/ui_check.py.

Why a pipe: `--remote-debugging-port` opens a DevTools port that any local user can connect to
(and with `--remote-allow-origins=*` any page): it reads files and drives the browser.
`--remote-debugging-pipe` opens none: the protocol runs over the browser's fds 3 (commands in)
and 4 (replies out), NUL-terminated JSON; the page is reached through a flat session
(Target.attachToTarget). The browser exits by itself when the pipe closes (its owner died).

Chromium runs sandboxed unless this user is root (it refuses to start sandboxed as root), in
its own process group, with its profile (and its temporary folders: TMPDIR) in a 0700 temp
folder; `close()` stops the group (SIGTERM, then SIGKILL) and removes the profile. The caller
stops it on its signals (ui_check.stop_on_signals).

    with Browser("chromium") as b: b.cmd("Page.navigate", url="http://127.0.0.1:5000/")
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import tempfile
import time
from pathlib import Path

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Browser:
    """Headless Chromium, one tab, driven over a DevTools pipe (see the module doc)."""

    def __init__(self, binary: str, width: int = 1500, height: int = 1150, timeout: float = 60,
                 on_event=None):  # fmt: skip
        """on_event(message): called with every event (a message that answers no command)."""
        self.profile = tempfile.mkdtemp(prefix="ui_check_profile_")  # 0700
        self.pid, self._buf, self._id, self.session = 0, b"", 0, ""
        self.on_event = on_event
        sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []  # root: Chromium refuses it
        flags = [*sandbox, "--headless", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking", "--disable-sync",
                 "--disable-component-update", "--hide-scrollbars", f"--window-size={width},{height}",
                 f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"]  # fmt: skip
        into, self._out = os.pipe()  # we write commands, the browser reads them as fd 3
        self._in, out = os.pipe()  # the browser writes replies as fd 4, we read them
        try:
            # above 4, so that the two dup2s below cannot overwrite one another
            far = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (into, out)]
            env = {**os.environ, "TMPDIR": self.profile}  # its singleton folders: not in /tmp
            null = (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDWR, 0)
            actions = [null, (os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2),
                       (os.POSIX_SPAWN_DUP2, far[0], 3), (os.POSIX_SPAWN_DUP2, far[1], 4)]  # fmt: skip
            # its own process group (stopped as one), default signals, nothing blocked
            self.pid = os.posix_spawnp(binary, [binary, *flags], env, file_actions=actions,
                                       setsid=True, setsigdef=STOPS, setsigmask=())  # fmt: skip
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (into, out, *locals().get("far", [])):
                os.close(fd)
        try:
            page = self._page(timeout)
            self.session = self.cmd("Target.attachToTarget", targetId=page, flatten=True)[
                "sessionId"
            ]
            self.cmd("Page.enable")
            self.cmd("Emulation.setDeviceMetricsOverride", width=width, height=height,
                     deviceScaleFactor=1, mobile=False)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def _page(self, timeout: float) -> str:
        """The target id of the browser's first tab (it opens with about:blank)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pages = [t["targetId"] for t in self.cmd("Target.getTargets", timeout=timeout,
                     session=False)["targetInfos"] if t.get("type") == "page"]  # fmt: skip
            if pages:
                return pages[0]
            time.sleep(0.3)
        raise RuntimeError("Chromium opened no tab")

    def cmd(self, method: str, timeout: float = 60, session: bool = True, **params) -> dict:
        """Send one DevTools command (to the tab unless session=False) and return its result."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._out, data) :]
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
                if "id" not in reply and self.on_event:
                    self.on_event(reply)
            if not self._read(deadline - time.monotonic()):
                raise TimeoutError(f"Chromium did not answer {method} in {timeout:.0f} s")

    def _read(self, timeout: float) -> bool:
        """Add what the browser wrote within `timeout` s to the buffer; False if nothing."""
        if timeout <= 0 or not select.select([self._in], [], [], timeout)[0]:
            return False
        chunk = os.read(self._in, 1 << 20)
        if not chunk:
            raise RuntimeError("Chromium closed its DevTools pipe")
        self._buf += chunk
        return True

    def pump(self, seconds: float) -> None:
        """Hand the events of the next `seconds` to on_event."""
        deadline = time.monotonic() + seconds
        while self._read(deadline - time.monotonic()):
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                message = json.loads(raw)
                if "id" not in message and self.on_event:
                    self.on_event(message)

    def close(self) -> None:
        """Stop the browser's process group (SIGTERM, SIGKILL after 10 s), remove its profile."""
        for fd in ("_out", "_in"):  # closing the pipe alone makes the browser exit
            with contextlib.suppress(AttributeError, OSError):
                os.close(getattr(self, fd))
        if self.pid:
            _stop_group(self.pid, grace=10.0)
            self.pid = 0
        shutil.rmtree(self.profile, ignore_errors=True)

    # driving the tab
    def text(self) -> str:
        return self.js("document.body ? document.body.innerText : ''") or ""

    def js(self, expression: str):
        r = self.cmd("Runtime.evaluate", expression=expression, returnByValue=True)
        return r.get("result", {}).get("value")

    def until(self, ready, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return True
            time.sleep(0.5)
        return False

    def load(self, url: str, wait_for: list[str], search: str = "", timeout: float = 60.0) -> dict:
        """Open `url` in a fresh document, type `search` into the page's search box if given
        (the run page's "Search metric charts", a regex), and wait until every string of
        `wait_for` is on the page (or the text settles, for an empty list);
        {"url", "title", "text", "missing"}."""
        self.cmd("Page.navigate", url="about:blank")  # hash routes: force a fresh app load
        self.cmd("Page.navigate", url=url)
        if search:
            box = "document.querySelector('input[placeholder^=\"Search\"]')"
            if self.until(lambda: self.js(f"!!{box}"), timeout):
                self.js(f"{box}.focus()")
                self.cmd("Input.insertText", text=search)
        seen = {"text": None, "since": time.monotonic()}

        def ready() -> bool:
            text = self.text()
            if wait_for:
                return all(w in text for w in wait_for)
            if text != seen["text"]:
                seen.update(text=text, since=time.monotonic())
            return time.monotonic() - seen["since"] > 3 and len(text) > 200

        if self.until(ready, timeout) and wait_for:
            time.sleep(1.5)  # let the charts finish drawing
        text = self.text()
        where = self.js("[location.href, document.title]")
        return {"url": where[0], "title": where[1], "text": text,
                "missing": [w for w in wait_for if w not in text]}  # fmt: skip

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.cmd("Page.captureScreenshot", format="png")["data"]))


def _stop_group(pid: int, grace: float) -> None:
    """SIGTERM to process group `pid` (its leader our child), SIGKILL to what is left after
    `grace` s; the leader reaped (a zombie leader would keep the group alive)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline, reaped = time.monotonic() + grace, False
    while time.monotonic() < deadline + 5:  # past that: a member that even SIGKILL did not end
        with contextlib.suppress(ChildProcessError):
            reaped = reaped or os.waitpid(pid, os.WNOHANG) != (0, 0)
        try:
            os.killpg(pid, signal.SIGKILL if time.monotonic() > deadline else 0)
        except ProcessLookupError:
            return  # nothing of the group is left
        time.sleep(0.1)
