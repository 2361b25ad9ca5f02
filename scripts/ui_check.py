"""Look at a finished run as a person would: the MLflow UI in headless Chromium, with screenshots.

Starts `mlflow ui` on the store the way `rcgrpo ui` does (rcgrpo.mlflow_ui.start_mlflow, a free
port on 127.0.0.1), finds the last finished `pipeline` run of experiment `rcgrpo`, its `rl` run
and the episode traces of its RL-task evaluations, and loads in Debian's `chromium` (headless,
driven over the Chrome DevTools Protocol with `websockets`, a Prefect dependency):

    experiment.png     the link rcgrpo prints for the experiment: the model-training view
                       (runs table); asserts the page lists the run `pipeline`
    default_view.png   the same experiment without `?workflowType=`: what MLflow 3.17 opens by
                       default (its GenAI overview, whatever the experiment's kind tag says);
                       recorded, and reported, not asserted
    rl_metrics.png     the rl run's "Model metrics" charts, filtered to the reward and the
                       zero-variance ones with the page's search box (a regex); asserts
                       reward/mean and rollout/zero_variance_frac are charted
    trace_success.png  one successful and one failed episode (after RL where there are any,
    trace_failure.png  else before), each opened in the trace view; asserts the trace name and
                       one of its tool-call spans are on the page

A fresh browser profile has only MLflow's own panels closed (the assistant and two one-time
hints, via localStorage): what a person closes once. The view itself comes from the URL.
Exit 1 with one line per failed check; the last line printed is a JSON summary.

    .venv/bin/python scripts/ui_check.py                      # the project's mlflow/ store
    .venv/bin/python scripts/ui_check.py --store /tmp/x/mlflow --out reports/ui_check
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# panels a person closes once; the workflow type is deliberately NOT preset (the URL sets it)
QUIET = {"mlflow.assistant.panelOpen_v1": "false",
         "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": "true",
         "mlflow.detectIssues.guidanceShown_v1": "true",
         "mlflow.flagForReview.guidanceShown_v1": "true"}  # fmt: skip


def chromium() -> str | None:
    """The Chromium binary: $RCGRPO_CHROMIUM, else `chromium` (Debian's package) on PATH."""
    return os.environ.get("RCGRPO_CHROMIUM") or shutil.which("chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """Headless Chromium driven over the DevTools protocol (one tab)."""

    def __init__(self, binary: str, auth: str = "", width: int = 1500, height: int = 1150):
        from websockets.sync.client import connect

        port, self.profile = _free_port(), tempfile.mkdtemp(prefix="ui_check_profile_")
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking", "--disable-sync",
                 "--disable-component-update", "--hide-scrollbars", f"--window-size={width},{height}",
                 f"--user-data-dir={self.profile}", f"--remote-debugging-port={port}",
                 "--remote-allow-origins=*", "about:blank"]  # fmt: skip
        env = {**os.environ, "TMPDIR": self.profile}  # its singleton socket folder: not in /tmp
        self.proc = subprocess.Popen([binary, *flags], stdout=subprocess.DEVNULL, env=env,
                                     stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2) as r:
                    page = next(t for t in json.load(r) if t.get("type") == "page")
                break
            except (OSError, StopIteration):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.close()
                    raise RuntimeError(f"{binary} did not open its DevTools port") from None
                time.sleep(0.3)
        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self._id = 0
        self.cmd("Page.enable")
        self.cmd("Emulation.setDeviceMetricsOverride", width=width, height=height,
                 deviceScaleFactor=1, mobile=False)  # fmt: skip
        script = "".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});"
                         for k, v in QUIET.items())  # fmt: skip
        self.cmd("Page.addScriptToEvaluateOnNewDocument", source=script)
        if auth:  # the login a person types once at the browser's prompt, on every request
            self.cmd("Network.enable")
            self.cmd("Network.setExtraHTTPHeaders", headers={"Authorization": auth})

    def cmd(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def text(self) -> str:
        return self._js("document.body ? document.body.innerText : ''") or ""

    def _js(self, expression: str):
        r = self.cmd("Runtime.evaluate", expression=expression, returnByValue=True)
        return r.get("result", {}).get("value")

    def _until(self, ready, timeout: float) -> bool:
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
            if self._until(lambda: self._js(f"!!{box}"), timeout):
                self._js(f"{box}.focus()")
                self.cmd("Input.insertText", text=search)
        seen = {"text": None, "since": time.monotonic()}

        def ready() -> bool:
            text = self.text()
            if wait_for:
                return all(w in text for w in wait_for)
            if text != seen["text"]:
                seen.update(text=text, since=time.monotonic())
            return time.monotonic() - seen["since"] > 3 and len(text) > 200

        if self._until(ready, timeout) and wait_for:
            time.sleep(1.5)  # let the charts finish drawing
        text = self.text()
        where = self._js("[location.href, document.title]")
        return {"url": where[0], "title": where[1], "text": text,
                "missing": [w for w in wait_for if w not in text]}  # fmt: skip

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.cmd("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the browser may be gone already
            self.ws.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
        shutil.rmtree(self.profile, ignore_errors=True)


def span_listed(text: str, name: str) -> bool:
    """Whether the trace view's span tree lists a span `name`: its name on a line of its own,
    its duration on the next (a call string in an input or output does not look like that)."""
    return re.search(rf"^{re.escape(name)}\n[\d.,]+ ?(ns|µs|ms|s|min)$", text, re.M) is not None


def find_run(client, experiment_id: str, run_id: str | None) -> tuple:
    """(pipeline run, its rl run or None, {"success" | "failure": a trace with tool calls})."""
    import mlflow

    if run_id:
        pipeline = client.get_run(run_id)
    else:
        found = client.search_runs([experiment_id], "tags.`mlflow.runName` = 'pipeline' AND "
                                   "attributes.status = 'FINISHED'",
                                   order_by=["attributes.start_time DESC"], max_results=1)  # fmt: skip
        if not found:
            raise SystemExit("ui_check: no finished `pipeline` run in experiment rcgrpo")
        pipeline = found[0]
    children = client.search_runs(
        [experiment_id], f"tags.`mlflow.parentRunId` = '{pipeline.info.run_id}'"
    )
    by_name = {r.info.run_name: r for r in children}
    picks: dict = {}
    for stage in ("eval_rl_tasks_after", "eval_rl_tasks_before", "eval", "rl"):
        if stage not in by_name:
            continue
        for trace in mlflow.search_traces(locations=[experiment_id], return_type="list",
                                          run_id=by_name[stage].info.run_id, max_results=500):  # fmt: skip
            outcome = trace.info.tags.get("outcome")
            tools = [s.name for s in trace.data.spans if s.span_type == "TOOL"]
            if outcome in ("success", "failure") and outcome not in picks and tools:
                picks[outcome] = {"trace_id": trace.info.trace_id, "tool": tools[0],
                                  "name": trace.info.tags.get("mlflow.traceName", ""),
                                  "stage": stage, "task_id": trace.info.tags.get("task_id")}  # fmt: skip
        if len(picks) == 2:
            break
    return pipeline, by_name.get("rl"), picks


def check(store: Path, out: Path, run_id: str | None = None, port: int = 0) -> dict:
    """Start the UI on `store`, load the pages, save PNGs in `out`; the summary (see module)."""
    from mlflow.tracking import MlflowClient

    from rcgrpo import mlflow_ui, servers
    from rcgrpo.tracking import registry

    binary = chromium()
    if not binary:
        raise SystemExit("ui_check: no `chromium` on PATH (Debian: apt-get install -y chromium)")
    out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{store.resolve() / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    os.environ["MLFLOW_TRACKING_URI"] = uri  # mlflow.search_traces reads the process default
    exp = client.get_experiment_by_name("rcgrpo")
    if exp is None:
        raise SystemExit(f"ui_check: no experiment `rcgrpo` in {uri}")
    pipeline, rl, picks = find_run(client, exp.experiment_id, run_id)
    server = mlflow_ui.start_mlflow(store, port or _free_port(), log_dir=out)
    summary: dict = {"run_id": pipeline.info.run_id, "experiment_kind":
                     exp.tags.get("mlflow.experimentKind"), "pages": {}, "failed": []}  # fmt: skip
    try:
        servers.wait_ready([server], 180)
        host, eid = server.url, exp.experiment_id
        pages = [("experiment", registry.experiment_url(eid, host), ["Runs", "pipeline"], ""),
                 ("default_view", f"{host}/#/experiments/{eid}", [], "")]  # fmt: skip
        if rl is not None:  # the charts a person looks for, filtered as a person would
            pages.append(("rl_metrics", registry.run_url(rl.info.run_id, host, "model-metrics"),
                          ["rl (reward/mean)", "rl (rollout/zero_variance_frac)"],
                          "reward/mean|zero_variance"))  # fmt: skip
        for outcome, pick in sorted(picks.items(), reverse=True):
            url = registry.trace_url(pipeline.info.run_id, pick["trace_id"], host)
            pages.append((f"trace_{outcome}", url, [pick["name"], pick["tool"]], ""))
        summary["traces"] = picks
        browser = Browser(binary, mlflow_ui.basic_auth_header(store))
        try:
            for name, url, wait_for, search in pages:
                page = browser.load(url, wait_for, search)
                browser.screenshot(out / f"{name}.png")
                (out / f"{name}.txt").write_text(page["text"])
                summary["pages"][name] = {"url": url, "landed": page["url"], "title": page["title"],
                                          "png": str(out / f"{name}.png")}  # fmt: skip
                if page["missing"]:
                    summary["failed"].append(f"{name}: {page['missing']} not on {url}")
                if name.startswith("trace_") and not span_listed(page["text"], wait_for[1]):
                    summary["failed"].append(f"{name}: no span {wait_for[1]!r} in the span tree")
        finally:
            browser.close()
    finally:
        servers.stop(server)
    if rl is None:
        summary["failed"].append("no rl run under the pipeline run: no metric charts to check")
    summary["failed"] += [f"no {o} episode trace with a tool call"
                          for o in ("success", "failure") if o not in picks]  # fmt: skip
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default="", help="folder holding mlflow.db (default: the project's)")
    ap.add_argument("--out", default="reports/ui_check", help="where the PNGs and texts go")
    ap.add_argument("--run-id", default="", help="the pipeline run (default: the last finished)")
    ap.add_argument("--port", type=int, default=0, help="MLflow UI port (default: a free one)")
    args = ap.parse_args()
    from rcgrpo.tracking.runs import store_dir

    store = Path(args.store) if args.store else store_dir()
    summary = check(store, Path(args.out), args.run_id or None, args.port)
    for line in summary["failed"]:
        print(f"ui_check: FAILED {line}")
    print(json.dumps(summary))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
