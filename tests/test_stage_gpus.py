"""The data stage and the evaluations use every GPU: vLLM servers of their own (no trainer shares
the GPUs then), at their own memory share, never asleep; `rcgrpo plan` says each stage's use.

    .venv/bin/pytest tests/test_stage_gpus.py -q
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.rollout.config import RolloutConfig, for_inference

PAPER_ROLL = RolloutConfig(engine="vllm", vllm_gpu_memory_utilization=0.7, vllm_sleep_mode=True)


def test_eight_visible_gpus_give_eight_servers_at_the_stage_share_awake():
    visible = [str(i) for i in range(8)]
    r = for_inference(PAPER_ROLL, 0, 0.85, visible)
    assert (r.n_servers, r.vllm_gpu_memory_utilization, r.vllm_sleep_mode) == (8, 0.85, False)
    assert r.server_devices(visible) == visible  # one server per GPU, in order
    tp2 = for_inference(RolloutConfig(engine="vllm", tensor_parallel_size=2), 0, 0.85, visible)
    assert tp2.server_devices(visible) == ["0,1", "2,3", "4,5", "6,7"]


def test_a_given_count_pinned_devices_the_cpu_and_the_hf_engine():
    assert for_inference(PAPER_ROLL, 3, 0.85, ["0", "1", "2", "3"]).n_servers == 3
    pinned = RolloutConfig(engine="vllm", vllm_devices=("2", "5"))
    assert for_inference(pinned, 0, 0.85, ["0", "1"]).vllm_devices == ("2", "5")  # kept
    cpu = RolloutConfig(engine="vllm", vllm_servers=2)
    assert for_inference(cpu, 0, 0.85, []).n_servers == 2  # none visible: the section's count
    hf = RolloutConfig(engine="hf")
    assert for_inference(hf, 4, 0.85, ["0"]) is hf  # no servers to place


def test_plan_prints_each_stages_gpu_use():
    out = subprocess.run(
        [sys.executable, "-m", "rcgrpo.cli", "plan", "--profile", "qwen2.5-7b-instruct"]
        + ["--preset", "paper", "--gpus", "8", "--gpu-memory", "80"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next(x for x in out.stdout.splitlines() if "GPUs per stage" in x)
    assert "dataset 8 vLLM servers x 1 GPU at 0.85" in line
    assert "eval 8 vLLM servers x 1 GPU at 0.85" in line and "rl 8 ranks" in line
    # GPU 0 per stage, every process there: the stages' own processes hold no policy with vLLM
    gpu0 = [x.strip() for x in out.stdout.splitlines()]
    assert (
        "data: stage process 0 GB (policy on the CPU) + vLLM server 0 at 0.85 + its context "
        "= 72.8 GB"
    ) in gpu0
    assert "rctp: rank 0 trainer, update peak 60.4 GB" in gpu0
    assert (
        "rl: rank 0 trainer 18.0 GB + its vLLM server 0 at 0.70 + its context: rollouts 78.0 GB, "
        "update 59.1 GB (vLLM asleep)"
    ) in gpu0


def test_a_server_beside_a_full_gpu_asks_for_what_is_left():
    """0.70 asked beside 30 GB on an 85 GB GPU: (55 GB - 1 GiB) / 85 GB = 0.634; its 0.5 GB
    context on top."""
    from rcgrpo.training.plan.stages import _server

    held, text = _server(0.70, 30e9, 85e9, 0.5e9)
    assert held == 0.634 * 85e9 + 0.5e9
    assert text == "vLLM server 0 at 0.63 (lowered from 0.70: 55.0 GB free) + its context"


@pytest.mark.slow
def test_an_evaluation_runs_on_its_own_two_servers(tmp_path, monkeypatch):
    """eval.vllm_servers=2 on the CPU: the evaluation's engine starts two real vLLM servers,
    awake, whatever the rollout section says (one server, sleep mode on)."""
    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import run_eval
    from rcgrpo.models.loading import load_policy, save_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout import execution

    model = ModelConfig(profile="tiny", lora=True, lora_r=8)
    folder = save_policy(load_policy(model), tmp_path / "policy", {"protocol": "bfcl"})
    seen, real = [], execution.make_engine
    monkeypatch.setattr(
        execution,
        "make_engine",
        lambda cfg, p, env, **k: seen.append(real(cfg, p, env, **k)) or seen[-1],
    )
    roll = RolloutConfig(
        engine="vllm",
        max_new_tokens=8,
        max_total_tokens=1200,
        max_steps=1,
        vllm_max_lora_rank=8,
        vllm_max_num_seqs=4,
        vllm_sleep_mode=True,
    )
    cfg = EvalConfig(
        other_protocol=False,
        categories=("base",),
        limit=1,
        tokens=("high", "low"),
        vllm_servers=2,
        out_dir=str(tmp_path / "eval"),
    )
    report = run_eval(cfg, model, folder, BFCL, roll)
    (engine,) = seen
    assert len(engine.server_stats) == 2 and engine.cfg.vllm_sleep_mode is False
    assert engine.servers == []  # both stopped when the evaluation ended
    assert report  # it scored
