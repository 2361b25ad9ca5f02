"""Look at a finished run as a person would: the MLflow UI in headless Chromium, with screenshots.

Starts `mlflow ui` on the store the way `rcgrpo ui` does (rcgrpo.mlflow_ui.start_mlflow, a free
port on 127.0.0.1), finds the last finished `pipeline` run of experiment `rcgrpo`, its `rl` run
and the episode traces of its RL-task evaluations, and loads in Debian's `chromium` (headless,
driven over a DevTools pipe, no port; sandboxed unless root: scripts/headless.py):

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
Exit 1 with one line per failed check; the last line printed is a JSON summary. On SIGINT,
SIGTERM or SIGHUP, and when its parent dies, it stops the browser's process group, removes its
profile and stops the UI, then exits 128+signal.

    .venv/bin/python scripts/ui_check.py                      # the project's mlflow/ store
    .venv/bin/python scripts/ui_check.py --store /tmp/x/mlflow --out reports/ui_check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import sys
from pathlib import Path

from headless import STOPS, Browser

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
        browser = Browser(binary)
        try:
            script = "".join(f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});"
                             for k, v in QUIET.items())  # fmt: skip
            browser.cmd("Page.addScriptToEvaluateOnNewDocument", source=script)
            # the login a person types once at the browser's prompt, on every request
            browser.cmd("Network.enable")
            browser.cmd("Network.setExtraHTTPHeaders",
                        headers={"Authorization": mlflow_ui.basic_auth_header(store)})  # fmt: skip
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


def _exit_on(signum: int, _frame) -> None:
    for sig in STOPS:  # a second signal must not cut the clean-up short
        signal.signal(sig, signal.SIG_IGN)
    raise SystemExit(128 + signum)  # the finally blocks stop the browser and the UI


def stop_on_signals() -> None:
    """SIGINT, SIGTERM, SIGHUP, and the death of the parent (PR_SET_PDEATHSIG: SIGTERM), end
    this check through its finally blocks: the browser's group stopped, its profile removed."""
    from rcgrpo.procs import set_parent_death_signal

    parent = os.getppid()
    for sig in STOPS:
        signal.signal(sig, _exit_on)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the prctl took effect
        raise SystemExit(128 + signal.SIGTERM)


def main() -> int:
    stop_on_signals()
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
