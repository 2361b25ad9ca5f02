"""The other nodes of a multi-node `rcgrpo run`: node 0 runs the pipeline, every node K > 0
runs the same command with `--node-rank K` and joins each training stage node 0 starts.

Why node 0 alone runs the rest: the data stage, the evaluations, the Prefect flow and the MLflow
runs are one per pipeline; only the training stages spread over nodes. A joining node resolves
the same settings, then waits for the `run_config.json` node 0 writes into a stage's out_dir
when it starts that stage (the out_dirs must be on a folder every node reads), and starts its own
torchrun agent for it from that file (rcgrpo.tracking.stage.launch: torchrun's static rendezvous
at node 0's --rdzv-endpoint; node 0 holds global rank 0, which logs and saves). A stage node 0
skips (a resume) is skipped here too: the node joins whichever planned stage starts next.

    rcgrpo run --procs 8 --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500   # on node 0
    rcgrpo run --procs 8 --nnodes 2 --node-rank 1 --rdzv-endpoint node0:29500   # on node 1
"""

from __future__ import annotations

import time
from pathlib import Path

from rcgrpo.run_config import RunConfig, stage_section
from rcgrpo.tracking.stage import launch
from rcgrpo.tracking.stage_process import CONFIG_FILE


def training_stages(rc: RunConfig) -> list[str]:
    """The training stages of the run's plan, in order: the fine-tuning RL starts from, RL."""
    out = [rc.rl.init] if "finetune" in rc.plan.stages else []
    return out + (["rl"] if "rl" in rc.plan.stages else [])


def follow(rc: RunConfig, node_rank: int, resume: bool = False, poll_s: float = 1.0) -> list[Path]:
    """Join every training stage node 0 starts from now on; the stages' model folders."""
    left, finals, since = training_stages(rc), [], time.time()
    while left:
        specs = [Path(stage_section(rc, s).out_dir) / CONFIG_FILE for s in left]
        started = [i for i, p in enumerate(specs) if p.exists() and p.stat().st_mtime >= since]
        if not started:
            time.sleep(poll_s)
            continue
        i = started[-1]  # the latest planned stage node 0 started (earlier ones it skipped)
        print(f"node {node_rank}: joining {left[i]} ({specs[i]})", flush=True)
        finals.append(launch(left[i], RunConfig.load(specs[i]), None, resume, node_rank))
        left, since = left[i + 1 :], time.time()
    return finals
