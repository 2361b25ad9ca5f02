"""Scale-out: ranks share the RL update evenly (on `rcgrpo plan`'s episode mix, params.yaml's
rl section, the replayed ground-truth shapes, the slowest of 8 ranks' estimated cost is within
10 % of the mean; bench/rank_balance.py prints the figures, before and after), and a pipeline
killed during RL resumes with `rcgrpo run --resume` to the numbers of an uninterrupted run.

    .venv/bin/pytest tests/test_scale.py -q
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import rank_balance  # noqa: E402


def test_eight_ranks_within_ten_percent_of_mean():
    minis, _ = rank_balance.paper_mix()
    useful = sum(r for mini, _ in minis for r, _ in mini) / 8
    figures = rank_balance.figures(8)
    loads, wall = figures["balanced"]
    assert max(loads) <= 1.10 * useful
    assert wall <= 1.10 * useful  # each mini-batch waits for its slowest rank
    # the contiguous longest-first split it replaces was not
    assert max(figures["contiguous"][0]) > 1.10 * useful


def test_shared_micro_batches_dealt_by_what_they_compute_within_ten_percent_of_mean():
    """rl.shared_prefix on (the default): micro-batches of whole groups, each rank's load as the
    shared forward computes it. Dealt by their padded-row costs (the groups' rows counted as
    padded rows), the slowest rank was 1.33x the mean."""
    minis, _ = rank_balance.paper_mix(shared=True)
    useful = sum(r for mini, _ in minis for r, _ in mini) / 8
    figures = rank_balance.figures(8, shared=True)
    assert max(figures["computed costs"][0]) <= 1.10 * useful
    assert max(figures["padded costs"][0]) > 1.25 * useful


# -- resume through the pipeline ---------------------------------------------------------------

RESUME_SETS = [
    "dataset.train_tasks=4",
    "dataset.test_tasks=4",
    'dataset.rollouts="off"',
    "rctp.epochs=1",
    "rl.steps=3",
    "rl.advantage=sign",  # 2R - 1: a tiny model's all-zero rewards still move the weights
    "rl.save_every=1",
    "rl.tasks_per_step=2",
    "rl.group_size=2",
    "rl.mini_batch_size=2",
    "rl.micro_batch_size=2",
    "rollout.max_new_tokens=24",
    "rollout.max_total_tokens=1024",
    "rollout.max_steps=2",
]


def _run_cmd(*extra: str, sets=RESUME_SETS) -> list[str]:
    cmd = [sys.executable, "-m", "rcgrpo.cli", "run", "--profile", "tiny"]
    cmd += ["--stages", "data,finetune,rl", *extra]
    return cmd + [a for pair in sets for a in ("--set", pair)]


def _kill_after_first_checkpoint(proj: Path, env: dict) -> str:
    """Start the pipeline in its own process group; SIGKILL the whole group (the CLI, its
    Prefect task runner, tool workers) as soon as RL's first checkpoint is complete."""
    import os
    import signal
    import subprocess
    import time

    log = proj / "killed.log"
    first = proj / "outputs" / "rl" / "checkpoints" / "step_000001" / "state.pt"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            _run_cmd(), cwd=proj, env=env, stdout=fh, stderr=fh, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 600
            while not first.is_file() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert first.is_file() and proc.returncode == -signal.SIGKILL, text[-4000:]
    return text


def _weights(folder: Path) -> dict:
    """Every tensor saved in a policy folder (the tiny profile: the whole model; LoRA: the
    adapter), by file and name."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    return {f"{f.name}:{k}": v for f in files for k, v in load_file(f).items()}


@pytest.mark.slow
def test_run_resume_after_a_kill_during_rl_ends_as_an_uninterrupted_run(prefect_server, tmp_path):
    """`rcgrpo run` killed (SIGKILL, the whole process group) after RL's first checkpoint, then
    `rcgrpo run --resume`: data and fine-tuning are skipped, RL continues its own MLflow run
    from step 1, and the last step's reward and loss and the final weights equal those of an
    uninterrupted RL run from the same fine-tuned model and seed (to 1e-6)."""
    import json
    import subprocess

    import torch
    from mlflow.tracking import MlflowClient
    from test_pipeline_e2e import copy_env, copy_project

    from rcgrpo.runtime import project_root

    proj = copy_project(project_root(), tmp_path / "proj")
    env = copy_env(proj)
    _kill_after_first_checkpoint(proj, env)
    rl_out = proj / "outputs" / "rl"
    assert not (rl_out / "final").exists()  # killed during RL
    saved = max(int(p.name.split("_")[1]) for p in (rl_out / "checkpoints").glob("step_*[0-9]"))

    # another setting that matters: refused in one line naming it, nothing touched
    other = [p if p != "rl.steps=3" else "rl.steps=4" for p in RESUME_SETS]
    bad = subprocess.run(
        _run_cmd("--resume", sets=other),
        cwd=proj,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "rl.steps is 4 now but was 3" in bad.stderr, bad.stderr[-2000:]

    done = subprocess.run(
        _run_cmd("--resume"), cwd=proj, env=env, capture_output=True, text=True, timeout=900
    )
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-5000:]
    assert "data: complete in the interrupted run" in text and "rctp: complete" in text
    # RL went on from its last checkpoint: no step before it was trained again
    assert f"rl step {saved}/3" not in text and f"rl step {saved + 1}/3" in text, text[-3000:]
    resumed = [json.loads(ln) for ln in (rl_out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in resumed] == [1, 2, 3]  # step 1 kept, not truncated nor repeated

    # the uninterrupted reference: the same RL stage (its run_config.json), another out_dir
    spec = json.loads((rl_out / "run_config.json").read_text())
    spec["rl"]["out_dir"] = str(proj / "outputs" / "rl_ref")
    (tmp_path / "ref.json").write_text(json.dumps(spec))
    ref = subprocess.run(
        [sys.executable, "-m", "rcgrpo.cli", "stage", "rl", "--config", str(tmp_path / "ref.json")],
        cwd=proj,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ref.returncode == 0, (ref.stdout + ref.stderr)[-4000:]
    once = [
        json.loads(ln) for ln in (proj / "outputs/rl_ref/metrics.jsonl").read_text().splitlines()
    ]
    for key in ("reward/mean", "loss/total", "loss/pg", "loss/kl"):
        assert abs(resumed[-1][key] - once[-1][key]) < 1e-6, (key, resumed[-1], once[-1])
    a, b = _weights(rl_out / "final"), _weights(proj / "outputs/rl_ref/final")
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6, rtol=0), name
    start = _weights(proj / spec["rl"]["init_path"])  # RL did move them: equality is not trivial
    assert max(float((a[n] - start[n]).abs().max()) for n in a if n in start) > 1e-6

    # one pipeline run and one RL run, continued: FINISHED, every step logged
    uri = f"sqlite:///{proj}/mlflow/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("rcgrpo").experiment_id])
    pipes = [r for r in runs if r.info.run_name == "pipeline"]
    rls = [
        r
        for r in runs
        if r.info.run_name == "rl"
        and r.data.tags.get("stage") == "rl"
        and r.data.tags.get("mlflow.parentRunId")
    ]
    assert len(pipes) == 1 and pipes[0].info.status == "FINISHED"
    assert len(rls) == 1 and rls[0].info.status == "FINISHED"
    steps = {m.step for m in client.get_metric_history(rls[0].info.run_id, "reward/mean")}
    assert steps == {1, 2, 3}


def test_resume_state_refuses_in_one_line_and_voids_what_a_redone_stage_fed(tmp_path, monkeypatch):
    """The state of `rcgrpo run --resume`: no run, a run that left nothing to resume, a finished
    run and a setting that matters are refused naming it; the rank count, execution and traces
    may change; a stage done anew drops the stages recorded after it and the started RL run."""
    import dataclasses
    import json

    from rcgrpo.config import ConfigError
    from rcgrpo.run_config import resolve
    from rcgrpo.tracking import orphans

    rc = resolve(None, "", "rctp+rc-grpo", {}, ["finetune", "rl"], 1)  # params.yaml here
    monkeypatch.setenv("RCGRPO_PROJECT", str(tmp_path))  # the state file goes there
    with pytest.raises(ConfigError, match=r"no pipeline run to resume in this project"):
        orphans.interrupted(rc)
    state = orphans.start("run1", rc.to_dict())
    with pytest.raises(ConfigError, match=r"nothing to resume: the interrupted run run1 left no"):
        orphans.interrupted(rc)  # it started over, silently, before
    orphans.record(state, "rl", {"run_id": "r0"}, done=False)  # an RL run to continue
    assert orphans.interrupted(rc)["run_id"] == "run1"
    wider = dataclasses.replace(rc, plan=dataclasses.replace(rc.plan, procs=8))
    ray = dataclasses.replace(rc, execution=dataclasses.replace(rc.execution, backend="ray"))
    assert orphans.interrupted(wider) and orphans.interrupted(ray)  # no number moves
    other = dataclasses.replace(rc, rl=dataclasses.replace(rc.rl, lr=1e-3, steps=7))
    with pytest.raises(ConfigError) as e:
        orphans.interrupted(other)
    assert str(e.value).startswith("rcgrpo run --resume: rl.lr is 0.001 now but was 0.0002 in ")
    assert "(and 1 more)" in str(e.value) and "\n" not in str(e.value)

    orphans.record(state, "data", {"md5": "a"})
    orphans.record(state, "rctp", {"model_path": "m"})
    orphans.record(state, "rl", {"run_id": "r"}, done=False)
    orphans.record(state, "data", {"md5": "b"})  # rebuilt: the fine-tuning and RL go with it
    saved = json.loads((tmp_path / orphans.STATE).read_text())
    assert (saved["done"], saved["runs"]) == ({"data": {"md5": "b"}}, {})
    orphans.finished(state)
    with pytest.raises(ConfigError, match=r"the last run here \(MLflow run run1\) finished"):
        orphans.interrupted(rc)


def test_resume_refuses_a_fine_tuned_model_another_command_replaced(tmp_path, monkeypatch):
    """`rcgrpo run --resume` skipped fine-tuning after a standalone `rcgrpo stage rctp` had
    written over the run's model, and RL resumed against another reference (loss/kl 1.03 at
    step 2). The model's sha256 is recorded when the stage finishes and checked on resume: the
    same bytes written again pass, other weights are refused in one line."""
    import torch

    from rcgrpo.config import ConfigError
    from rcgrpo.models.loading import load_policy, save_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.run_config import resolve
    from rcgrpo.tracking import orphans

    rc = resolve(None, "", "rctp+rc-grpo", {}, ["finetune", "rl"], 1)
    monkeypatch.setenv("RCGRPO_PROJECT", str(tmp_path))
    policy = load_policy(ModelConfig(profile="tiny"))
    final = save_policy(policy, tmp_path / "outputs" / "rctp" / "final", {"stage": "rctp"})
    state = orphans.start("run1", rc.to_dict())
    orphans.record(state, "rctp", {"run_id": "ft", "model_path": str(final), "config": {}})
    orphans.record(state, "rl", {"run_id": "rl1"}, done=False)  # RL had started
    assert orphans.interrupted(rc)["done"]["rctp"]["sha256"] == orphans.model_digest(final)
    save_policy(policy, final, {"stage": "rctp"})  # the same weights again: the same model
    assert orphans.model_complete(orphans.interrupted(rc), "rctp")
    with torch.no_grad():
        next(policy.model.parameters()).add_(0.01)  # what another fine-tuning leaves
    save_policy(policy, final, {"stage": "rctp"})
    with pytest.raises(ConfigError) as refused:
        orphans.interrupted(rc)
    message = str(refused.value)
    assert f"{final} is not the rctp model the interrupted run run1 trained" in message
    assert "nothing to resume" in message and "\n" not in message
    assert orphans.model_complete(state, "rctp") is None


# -- hangs named -----------------------------------------------------------------------------


def test_stall_verdict_names_the_rank_that_stopped_first():
    """Hand-made beats at t = 100 s, window 30 s: rank 1 stopped progressing at 60 (in its
    update), rank 0 at 65 (it then blocked in the all-reduce, unmarked), rank 2 waits at a
    gather since 50 (not a stall), rank 3 beat at 88 (alive)."""
    from rcgrpo.training.heartbeat import stalled

    def beat(r, progress, waiting=False, time=88.0, phase="update"):
        return {
            "rank": r,
            "pid": 10 + r,
            "step": 4,
            "phase": phase,
            "since": 55.0,
            "progress": progress,
            "waiting": waiting,
            "time": time,
        }

    beats = {0: beat(0, 65.0), 1: beat(1, 60.0), 2: beat(2, 50.0, "gather"), 3: beat(3, 95.0)}
    line = stalled(beats, 100.0, 30.0)
    assert line.startswith("rank 1 (pid 11) stalled: no progress for 40 s, in phase update of ")
    assert "step 4 (entered 45 s ago; stall window 30 s)" in line
    assert stalled(beats, 89.0, 30.0) is None  # nobody past the window yet (rank 1: 29 s)
    beats[3]["time"] = 50.0  # a frozen process: its beat thread stopped too
    assert stalled(beats, 100.0, 30.0).startswith("rank 3 (pid 13) stalled: no heartbeat for 50 s")
    beats[3]["phase"] = "done"  # it finished its loop: its silence is no stall
    assert stalled(beats, 100.0, 30.0).startswith("rank 1 (pid 11)")


@pytest.mark.slow
def test_a_stalled_rank_is_named_and_the_run_fails_within_the_window(tmp_path):
    """2 gloo ranks of the RL loop (the toy engine), heartbeats every 0.2 s, a 3 s window. Rank 1
    sleeps 600 s on entering the update of step 1 (RCGRPO_TEST_STALL: a test-only fault, a hang
    cannot be caused on demand) while rank 0 waits for it in a collective: rank 0's watcher
    names rank 1, its phase and the age in one line and the run fails in seconds, not at the
    process-group timeout (30 min) nor after the sleep."""
    import os
    import re
    import subprocess
    import time

    from test_distributed import WORKER, free_port

    from rcgrpo.training.rendezvous import SECRET_ENV, write_secret

    src = Path(__file__).parents[1] / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    env["RCGRPO_TEST_STALL"] = "1:update:600"
    env[SECRET_ENV] = str(write_secret(tmp_path))  # what every rank proves first
    env["TMPDIR"] = str(tmp_path)  # torchrun's torchelastic_* folder, left behind on a failure
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(WORKER),
        "rl-stall",
        str(tmp_path / "out.pt"),
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - start
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    found = re.search(
        r"rcgrpo: rank 1 \(pid \d+\) stalled: no progress for (\d+) s, in phase "
        r"update of step 1 ",
        text,
    )
    assert found, text[-3000:]
    assert 3 <= int(found.group(1)) <= 5  # named within the window plus two beats
    assert wall < 120, wall  # the sleep (600 s) and the gloo timeout (1,800 s) never reached
    beats = sorted(p.name for p in (tmp_path / "work" / "heartbeat").glob("rank_*.json"))
    assert beats == ["rank_0.json", "rank_1.json"]


def test_collective_timeout_follows_the_configured_engine():
    """HF: rollout.max_batch episodes at a time at the 10 steps/s floor. vLLM on an H100 80 GB
    (85.0e9 bytes to CUDA) at utilization 0.7, Qwen2.5-7B bf16, 73,728-token episodes: its KV
    cache holds 719,670 tokens = 9 episodes, each iteration reads the weights and 9 full
    contexts at 57,344 B a token, at 0.7 of 3.35 TB/s plus 3 ms: ~39 steps/s; the paper preset's
    160 episodes a rank are 18 waves: ~34,000 s (9.5 h; the HF figure said 6.1 h). Off a GPU the
    vLLM engine keeps --max-num-seqs at the floor."""
    import dataclasses

    from toy_models import tiny_llama

    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.training.distributed import collective_timeout_s, rollout_pace
    from rcgrpo.training.plan.constants import architecture
    from rcgrpo.training.plan.timing import vllm_pace

    model = tiny_llama(16, 0)
    hf = RolloutConfig(max_batch=64)
    assert rollout_pace(hf, "tiny", model) == (64, 10.0)
    assert collective_timeout_s(160, 64, 73_728) == 3 * 73_728 / 10  # 6.1 h: the HF figure
    vllm = dataclasses.replace(hf, engine="vllm", vllm_max_num_seqs=256)
    assert rollout_pace(vllm, "tiny", model) == (256, 10.0)  # the CPU build

    arch = architecture("qwen2.5-7b-instruct")
    seqs, rate = vllm_pace(
        "qwen2.5-7b-instruct", 2, "NVIDIA H100 80GB HBM3", 85.0e9, 0.7, 73_728, 256
    )
    assert seqs == 9
    read = arch.params() * 2 + 57_344 * 9 * 73_728
    assert abs(rate - 1 / (read / (3.35e12 * 0.7) + 0.003)) < 1e-9
    assert 38 < rate < 40
    timeout = collective_timeout_s(160, seqs, 73_728, rate)
    assert timeout == 18 * 73_728 / rate and 9 * 3600 < timeout < 10 * 3600
    # an A100 decodes slower: a longer timeout; an unknown GPU: the slowest known one's pace
    assert (
        vllm_pace("qwen2.5-7b-instruct", 2, "NVIDIA A100-SXM4-80GB", 85.0e9, 0.7, 73_728, 256)[1]
        < rate
    )
    assert vllm_pace("tiny-unknown", 2, "x", 85.0e9, 0.7, 73_728, 256) is None
