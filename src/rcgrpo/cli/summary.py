"""What `rcgrpo run` prints when the pipeline finishes: where the data version, the model, the
evaluation table, the report, the MLflow run and its episode traces are, and the RL tasks'
success before and after RL, from the pipeline flow's result (flows/pipeline.py).

    typer.echo("\\n".join(lines(out, minutes, prefect_api)))
"""

from __future__ import annotations

import json
from pathlib import Path


def lines(out: dict, minutes: float, api: str) -> list[str]:
    """The closing lines of `rcgrpo run` for the flow's result `out`."""
    from rcgrpo.tracking import registry
    from rcgrpo.tracking import runs as tracking

    return [
        f"pipeline finished in {minutes:.1f} min (MLflow run {out['run_id']})",
        f"  data version     {out.get('data_version')}",
        f"  model version    {out.get('model_version', '-')} (MLflow Model Registry)",
        f"  RL tasks         {before_after(out.get('rl_tasks') or {})}",
        f"  evaluation table {out.get('eval', {}).get('table', '-')}",
        f"  report           {out['report']}",
        f"  MLflow store     {tracking.tracking_uri()}",
        f"  MLflow UI        {registry.run_url(out['run_id'])}   (start it: rcgrpo ui)",
        f"  episode traces   {traces_url(out)}",
        f"  Prefect          {api}",
    ]


def traces_url(out: dict) -> str:
    """The MLflow trace view of the RL run's sampled episodes (each evaluation run has its own)."""
    from rcgrpo.tracking import registry

    run = (out.get("rl") or {}).get("run_id")
    return registry.run_url(run, page="traces") if run else "-"


def before_after(reports: dict) -> str:
    """'high 3/8 -> 8/8, low 1/8 -> 2/8 (greedy, paper reward)' from the RL-task reports."""
    loaded = {k: json.loads(Path(p).read_text()) for k, p in reports.items()}
    if not loaded:
        return "-"

    def count(when: str, token: str) -> str:
        runs = (loaded.get(when) or {}).get("runs", {}).get(token)
        if not runs:
            return "?"
        a = runs[min(runs)]["paper"]["pooled"]
        return f"{a['k']:g}/{a['n']:g}"

    tokens = sorted({t for r in loaded.values() for t in r["runs"]})
    parts = [f"{t} {count('before', t)} -> {count('after', t)}" for t in tokens]
    return ", ".join(parts) + " (success before -> after RL; greedy, paper reward)"
