"""`accelerate launch` over the SFT and RL loops: 2 CPU processes (gloo, DDP) make the
1-process update on the same global batch (losses, gradients and weights to 1e-6); in RL each
rank rolls out half the groups on its own engine (the real HF engine on the tiny profile too),
with the 1-process rollouts (greedy: the same ids; sampled: the same seeds).

    .venv/bin/pytest tests/test_distributed.py -q
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from distributed_worker import run
from toy_models import tiny_llama

from rcgrpo.training.rendezvous import SECRET_ENV, write_secret

WORKER = Path(__file__).parent / "distributed_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_process_starts_no_accelerator(tmp_path, monkeypatch):
    """Without `accelerate launch` the loop is the plain one: no accelerate state is created
    (transformers imports the accelerate package itself, so only its state can tell)."""
    from accelerate.state import PartialState

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert len(run(str(tmp_path))["history"]) == 4
    assert PartialState._shared_state == {}


def launch_two(stage: str, out: Path) -> dict:
    """The worker under `accelerate launch` with 2 processes; rank 0's result."""
    src = Path(__file__).parents[1] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
        "TMPDIR": str(out.parent),  # torch.distributed.run's torchelastic_* folders: not in /tmp
        # the run's secret every rank proves (rcgrpo stage NAME --procs N writes it; here the test)
        SECRET_ENV: str(write_secret(out.parent / "secret")),
    }
    # --multi_gpu starts the ranks with torch.distributed.run; on a box without a GPU the
    # Accelerator runs them on the CPU over gloo (`--cpu` alone would start 1 process, or
    # go through mpirun)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
        "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        str(WORKER), stage, str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return torch.load(out)


@pytest.mark.parametrize("stage", ["sft", "rl", "rl-hf", "rl-hf-engine"])
def test_two_gloo_processes_equal_one_process(tmp_path, stage):
    one = run(str(tmp_path / "one"), stage)
    two = launch_two(stage, tmp_path / "two.pt")
    # really 2 ranks over gloo with accelerate's multi-CPU set-up (DDP), not 2 lone copies
    assert (two["world"], two["backend"]) == (2, ("DistributedType.MULTI_CPU", "gloo"))
    assert len(two["history"]) == len(one["history"]) == (4 if stage == "sft" else 2)
    if stage == "rl":  # 3 groups of 4: rank 0 rolls out 2 groups, rank 1 one (whole groups)
        assert one["rolled_out"] == [[12, 12]] and two["rolled_out"] == [[8, 8], [4, 4]]
    if stage.startswith("rl-hf"):  # 4 groups of 2 on 2 engines: each rank rolls out half
        assert one["rolled_out"] == [[8, 8]] and two["rolled_out"] == [[4, 4], [4, 4]]
        assert one["greedy_own"] == [8] and two["greedy_own"] == [4, 4]
        # the process group waits one rank's rollout budget (2 x 4 episodes, 20,000 tokens)
        assert two["timeout_s"] == two["pg_timeout_s"] == 2000.0
        assert two["greedy"] == one["greedy"]  # split greedy rollouts = the 1-process ones
        assert len({len(ids) for ids in one["greedy"]}) > 1  # real episodes of many lengths
        rewards = [h["reward/mean"] for h in one["history"]]
        assert min(rewards) > 0 and max(rewards) < 1  # the advantages were not all zero
    for a, b in zip(one["history"], two["history"], strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if not k.startswith("perf/") and not k.endswith("tokens_per_s") and "time" not in k:
                assert abs(a[k] - b[k]) < 1e-6, (k, a[k], b[k])
    for name, g in one["grads"].items():  # the last step's gradient, all-reduced over ranks
        # rl-hf-engine: pi_old and the weights come from each step's first forwards, at weights
        # that differ between 1 and 2 ranks by the noise below (~1e-5): gradients within ~2e-6
        tol = 5e-6 if stage == "rl-hf-engine" else 1e-6
        assert torch.allclose(g, two["grads"][name], atol=tol, rtol=0), name
    assert one["grads"].keys() == two["grads"].keys() and one["grads"]
    if stage.startswith("rl-hf"):  # LoRA: the adapters moved away from their init (B = 0)
        moved = max(float(p.abs().max()) for n, p in one["state"].items() if "lora_B" in n)
    else:
        init = tiny_llama(32 if stage == "sft" else 16, 0).state_dict()
        moved = max(float((p - init[n]).abs().max()) for n, p in one["state"].items())
    # Adam divides by sqrt(v): where a LoRA gradient is ~1e-9 (B starts at 0) the summation-order
    # noise between 1 and 2 ranks (gradients equal to ~1e-7) moves a weight by up to ~1e-5 after
    # 8 updates at lr 2e-3; the toy models' full fine-tunes stay within 1e-6
    atol = 2e-5 if stage.startswith("rl-hf") else 1e-6
    for name, p in one["state"].items():
        assert torch.allclose(p, two["state"][name], atol=atol, rtol=0), name
    assert moved > 1e-4  # the weights did train: equality is not two untouched copies


def test_group_share_splits_whole_groups_contiguously():
    from rcgrpo.training.distributed import group_share

    assert [group_share(7, r, 2) for r in range(2)] == [(0, 4), (4, 7)]
    assert [group_share(256, r, 8) for r in range(8)] == [(32 * r, 32 * r + 32) for r in range(8)]
    assert [group_share(3, r, 4) for r in range(4)] == [(0, 1), (1, 2), (2, 3), (3, 3)]  # idle
    assert group_share(5, 0, 1) == (0, 5)


def test_collective_timeout_covers_one_ranks_rollout():
    """From the rollout budget: batches x episode tokens at 10 decode steps/s, at least 30 min
    (NCCL's default 10 min ended a long rollout as a hang)."""
    from rcgrpo.training.distributed import collective_timeout_s

    assert collective_timeout_s(160, 64, 81_920) == 3 * 81_920 / 10  # paper preset, 8 ranks
    assert collective_timeout_s(40, 64, 1_536) == 1800.0  # the CPU default: the floor


def test_local_device_is_the_ranks_own(monkeypatch):
    """One process: the device as given. Under a launcher on this GPU-less box: the CPU for
    auto, and a fixed cuda:0 for every rank is refused in one line."""
    from rcgrpo.training.distributed import local_device

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert local_device("auto") == "auto" and local_device("cuda:0") == "cuda:0"
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device("auto") == "cpu" and local_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="every rank on one GPU"):
        local_device("cuda:0")


@pytest.mark.slow
def test_pipeline_stages_on_two_ranks(prefect_server, mlflow_store, tmp_path, monkeypatch):
    """`rcgrpo run --procs 2`'s path: each training stage's Prefect task starts 2 ranks with
    torchrun (gloo here); rank 0 alone logs every step to the stage's MLflow run and saves the
    model. RCTP-FT's losses equal one process's; then RC-GRPO from it on the same tasks."""
    from mlflow.tracking import MlflowClient

    from flows.train import train_flow
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import write_jsonl
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.envs.bfcl.experts import expert
    from rcgrpo.envs.bfcl.perturbations import perturbations
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.run_config import resolve
    from rcgrpo.training.sft import run_sft
    from rcgrpo.training.sft_config import SFTConfig

    tasks = [t for t in tasks_in("train") if t.category == "base"][:2]
    records = [expert(t, "combined") for t in tasks] + [perturbations(tasks[0], "combined")[0]]
    write_jsonl(tmp_path / "rctp.jsonl", records)
    sft = {"data": str(tmp_path / "rctp.jsonl"), "epochs": 2, "batch_size": 3,
           "micro_batch_size": 1, "lr": 1e-3, "warmup_ratio": 0.0}  # fmt: skip
    model = {"profile": "tiny", "device": "cpu"}
    one = run_sft(SFTConfig(**sft, out_dir=str(tmp_path / "one")), ModelConfig(**model), BFCL)
    assert one.is_dir()
    last = json.loads((tmp_path / "one" / "metrics.json").read_text())  # its last step

    two = {"rctp": {**sft, "out_dir": str(tmp_path / "two")}, "model": model}
    ft = train_flow("rctp", resolve(None, sets=two, stages=["finetune"], procs=2))
    client = MlflowClient()
    losses = client.get_metric_history(ft["run_id"], "sft/loss")
    assert [m.step for m in losses] == [1, 2]  # 2 optimizer steps, logged once each (rank 0)
    assert abs(losses[-1].value - last["sft/loss"]) < 1e-6
    assert client.get_run(ft["run_id"]).data.tags["train.procs"] == "2"

    rl = {"init_path": ft["model_path"], "tasks_from": str(tmp_path / "rctp.jsonl"),
          "steps": 1, "tasks_per_step": 2, "group_size": 2, "mini_batch_size": 0,
          "micro_batch_size": 1, "lr": 1e-4, "out_dir": str(tmp_path / "rl")}  # fmt: skip
    rollout = {"max_new_tokens": 12, "max_total_tokens": 1024, "max_steps": 2}
    sets = {"rl": rl, "model": model, "rollout": rollout}
    out = train_flow("rl", resolve(None, sets=sets, stages=["rl"], procs=2))
    assert Path(out["model_path"], "rcgrpo_policy.json").exists()
    rewards = client.get_metric_history(out["run_id"], "reward/mean")
    assert [m.step for m in rewards] == [1]
    artifacts = {a.path for a in client.list_artifacts(out["run_id"])}
    assert "model" in artifacts
    from rcgrpo.tracking.traces import find_traces  # rank 0 traces the groups it sampled

    traced = find_traces(out["run_id"])  # default traces: step 1, first 2 groups; rank 1 has #1
    assert (
        sorted((t.info.tags["rl_step"], t.info.tags["group"]) for t in traced) == [("1", "0")] * 2
    )


def test_run_procs_is_checked_before_anything_starts():
    out = subprocess.run([sys.executable, "-m", "rcgrpo.cli", "run", "--procs", "0"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == "error: rcgrpo run --procs 0: must be >= 1"


def test_a_ranks_share_samples_what_one_process_does():
    """A rank's share of a step (first_index = its first episode in the batch), through the
    pipeline's sharded local engine too: sampled (T = 1) ids equal the whole batch's slice."""
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import ShardedEngine, make_engine

    policy = load_policy(ModelConfig(profile="tiny"))
    engine = make_engine(RolloutConfig(max_new_tokens=8, max_total_tokens=1400, max_steps=2), policy, BFCL)  # fmt: skip
    tasks = tasks_in("train")[::100][:4]
    whole = engine.rollout(tasks, None, "bfcl", seed=3)
    share = engine.rollout(tasks[2:], None, "bfcl", seed=3, first_index=2)
    sharded = ShardedEngine(engine, group=1, shard_size=1).rollout(tasks[2:], None, "bfcl", 3,
                                                                   first_index=2)  # fmt: skip
    assert [r.ids for r in share] == [r.ids for r in sharded] == [r.ids for r in whole[2:]]
    alone = engine.rollout(tasks[2:], None, "bfcl", seed=3)  # without the offset: other seeds
    assert [r.ids for r in alone] != [r.ids for r in whole[2:]]


@pytest.mark.parametrize("layout", [{"vllm_servers": 2}, {"vllm_devices": ("0",)},
                                    {"tensor_parallel_size": 2}])  # fmt: skip
def test_several_vllm_servers_per_rank_are_refused_under_a_launcher(monkeypatch, layout):
    """Under torchrun / rcgrpo run --procs every rank would start all the listed servers on the
    same GPUs: refused before anything loads (no model, no server, no data read)."""
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.run import run_rl

    monkeypatch.setenv("WORLD_SIZE", "2")
    rollout = RolloutConfig(engine="vllm", **layout)
    with pytest.raises(ValueError, match="under a launcher: every rank would start all"):
        run_rl(RLConfig(init_path="/nonexistent"), ModelConfig(profile="tiny"), BFCL, rollout)
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process may drive several servers
    with pytest.raises(FileNotFoundError, match="initial model"):
        run_rl(RLConfig(init_path="/nonexistent"), ModelConfig(profile="tiny"), BFCL, rollout)
