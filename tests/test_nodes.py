"""Several nodes through torchrun's own rendezvous: `rcgrpo stage STAGE --nnodes N
--rdzv-endpoint HOST:PORT` on each node starts that node's torchrun agent; the agents meet at the
endpoint (c10d, hosted by the agent on HOST) and train as one job.

On this machine two commands play two nodes of one gloo rank each, with the out_dir and the
MLflow store every node would share; the result equals one process's (loss and weights).

    .venv/bin/pytest tests/test_nodes.py -q
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rcgrpo.bfcl.tasks import tasks_in
from rcgrpo.chat.record import write_jsonl
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.envs.bfcl.experts import expert
from rcgrpo.envs.bfcl.perturbations import perturbations
from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.training.sft import run_sft
from rcgrpo.training.sft_config import SFTConfig

SFT = {"epochs": 2, "batch_size": 3, "micro_batch_size": 1, "lr": 1e-3, "warmup_ratio": 0.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_of_one_rank_equal_one_process(tmp_path, mlflow_store):
    tasks = [t for t in tasks_in("train") if t.category == "base"][:2]
    records = [expert(t, "combined") for t in tasks] + [perturbations(tasks[0], "combined")[0]]
    data = tmp_path / "rctp.jsonl"
    write_jsonl(data, records)
    model = {"profile": "tiny", "device": "cpu"}
    one = run_sft(
        SFTConfig(**SFT, data=str(data), out_dir=str(tmp_path / "one")), ModelConfig(**model), BFCL
    )

    endpoint = f"127.0.0.1:{free_port()}"
    sets = [f"--set={k}={v}" for k, v in {**SFT, "data": data, "out_dir": tmp_path / "two"}.items()]
    cmd = [sys.executable, "-m", "rcgrpo.cli", "stage", "rctp", *sets, "--allow-cpu",
           "--set", "model.profile=tiny", "--set", "model.device=cpu",
           "--nnodes", "2", "--rdzv-endpoint", endpoint]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [*cmd, "--node-rank", str(k)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for k in (1, 0)  # the other node may start first: it waits for node 0's rendezvous
    ]
    outs = [n.communicate(timeout=600)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert all("saved" in o for o in outs)

    two = tmp_path / "two"
    last_one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    last_two = json.loads((two / "metrics.json").read_text())
    assert abs(last_one["sft/loss"] - last_two["sft/loss"]) < 1e-6
    a, b = (
        load_file(Path(one) / "model.safetensors"),
        load_file(two / "final" / "model.safetensors"),
    )
    assert a.keys() == b.keys()
    # Adam divides by sqrt(v): where a gradient is ~0 the summation-order noise between 1 and 2
    # ranks (gradients equal to ~1e-7) moves a weight by up to ~3e-6 after 2 steps at lr 1e-3
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5, rtol=0), name
    init = load_policy(ModelConfig(**model)).model.state_dict()
    assert max(float((a[n] - init[n]).abs().max()) for n in a) > 1e-4  # it did train
    config = json.loads((two / "run_config.json").read_text())["pipeline"]
    assert (config["nodes"], config["procs"]) == (2, 1)  # really 2 ranks: 2 nodes x 1
    assert not list(two.glob(".torchrun-*"))  # each agent's temporary folder is gone


def test_several_nodes_need_a_rendezvous_endpoint():
    out = subprocess.run(
        [sys.executable, "-m", "rcgrpo.cli", "stage", "rctp", "--nnodes", "2", "--allow-cpu"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    said = out.stderr.strip().splitlines()[-1]
    assert said == "error: --nnodes 2 needs --rdzv-endpoint HOST:PORT, got ''"


@pytest.mark.slow
def test_rcgrpo_run_on_two_nodes_node_0_runs_the_pipeline_node_1_joins_its_training(
    prefect_server, tmp_path
):
    """`rcgrpo run --nnodes 2`: node 1 (started first) waits, then joins RCTP-FT when node 0's
    pipeline reaches it; node 0 alone builds the data and logs to MLflow."""
    from test_pipeline_e2e import copy_env, copy_project

    from rcgrpo.runtime import project_root

    proj = copy_project(project_root(), tmp_path / "proj")
    env = copy_env(proj)
    sets = ["dataset.train_tasks=4", "dataset.test_tasks=4", 'dataset.rollouts="off"',
            "rctp.epochs=1"]  # fmt: skip
    cmd = [sys.executable, "-m", "rcgrpo.cli", "run", "--profile", "tiny", "--allow-cpu",
           "--stages", "data,finetune", "--nnodes", "2",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]  # fmt: skip
    cmd += [a for s in sets for a in ("--set", s)]
    nodes = [
        subprocess.Popen(
            [*cmd, "--node-rank", str(k)],
            cwd=proj,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for k in (1, 0)
    ]
    outs = [n.communicate(timeout=900)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    final = proj / "outputs" / "rctp" / "final"
    assert "node 1: joining rctp" in outs[0] and f"saved {final}" in outs[0]
    assert "pipeline finished" in outs[1] and "data version" in outs[1]  # node 0: the pipeline
    config = json.loads((final.parent / "run_config.json").read_text())["pipeline"]
    assert (config["nodes"], config["procs"]) == (2, 1)


@pytest.mark.parametrize("in_run", [False, True], ids=["node-of-its-own", "inside-a-run"])
def test_a_launch_serves_one_base_per_node(tmp_path, monkeypatch, in_run):
    """Every node's torchrun agent (`stage.launch`: a joining node of `rcgrpo run --nnodes`,
    `rcgrpo stage rl --procs N`) runs its ranks inside one folder of served bases: both ranks
    get the same export, and the folder is gone when the launch ends (a joining node's ranks
    used to export a base each: 15 GB apiece at 7B). Inside a run (node 0 of `rcgrpo run`) the
    ranks use the run's folder, which the run removes. The torchrun launch is launch's own; the
    rank program is served_base_rank.py, which asks models.serving what a vLLM engine asks (an
    RL stage with a vLLM server per rank does not fit this 2-core box)."""
    from rcgrpo.models.serving import served_bases
    from rcgrpo.run_config import resolve
    from rcgrpo.tracking import stage, stage_process

    rc = resolve(None, sets={"rl": {"out_dir": str(tmp_path / "rl")}}, stages=("rl",), procs=2)
    (tmp_path / "rl" / "final").mkdir(parents=True)  # launch checks that the stage saved
    said, own = tmp_path / "said", tmp_path / "own"
    said.mkdir()
    rank = Path(__file__).with_name("served_base_rank.py")

    def torchrun_of_our_ranks(cmd, env):  # `-m rcgrpo.cli stage rl ...` -> the rank program
        at = cmd.index("rcgrpo.cli") - 1
        env = {**env, "OMP_NUM_THREADS": "1"}
        return subprocess.run([*cmd[:at], str(rank), str(said), str(own)], env=env).returncode

    monkeypatch.setattr(stage_process, "_run", torchrun_of_our_ranks)
    run_folder = tmp_path / "outputs" / "served-run"
    with served_bases(run_folder) if in_run else contextlib.nullcontext():
        stage.launch("rl", rc, None)
        if in_run:
            assert len([d for d in run_folder.iterdir() if d.is_dir()]) == 1  # one export
    got = [json.loads((said / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert got[0]["folder"] == got[1]["folder"] and all(g["done"] for g in got)
    root = Path(got[0]["root"])
    assert Path(got[0]["folder"]).parent == root
    if in_run:
        assert root == run_folder.resolve()
    else:
        assert root.name.startswith(f"served-{socket.gethostname()}-")
    assert not root.exists() and not own.exists()  # removed with the launch (or the run)
