"""The Trainer as the rl stage builds it (`build_trainer`: the policy saved by fine-tuning, its
engine wrapped by the execution backend, as `rcgrpo stage rl` and `rcgrpo run` do), not on a bare
engine: what the trainer reads of its engine (budgets, concurrency, replies) is the real one's.

    .venv/bin/pytest tests/test_rl_stage.py -q
"""

from __future__ import annotations

import pytest

from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.models.loading import load_policy, save_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.execution import ExecutionConfig, ShardedEngine, session
from rcgrpo.training.grpo.config import RLConfig
from rcgrpo.training.grpo.run import build_trainer

MODEL = ModelConfig(profile="tiny", device="cpu")


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """The fine-tuned policy the rl stage starts from (here the tiny model as built)."""
    folder = tmp_path_factory.mktemp("rctp") / "final"
    return save_policy(load_policy(MODEL), folder, {"protocol": "bfcl"})


def rl_cfg(start, out, **over) -> RLConfig:
    base = dict(init_path=str(start), tasks_from="", out_dir=str(out), tasks_per_step=2,
                group_size=2, steps=1, save_every=0, protocol="bfcl", advantage="sign")  # fmt: skip
    return RLConfig(**{**base, **over})


def test_the_collective_timeout_comes_from_the_stage_engine(start, tmp_path):
    """rollout.max_total_tokens 0 = the tiny profile's 73,728-token budget: 4 episodes a rank,
    max_batch 4 at once, at the 10 decode steps/s floor: one wave of 7,372.8 s. The wrapper the
    stage holds used to hide its engine's settings and the timeout fell to the 1,800 s floor."""
    from rcgrpo.training.distributed import collective_timeout_s

    roll = RolloutConfig(max_new_tokens=8, max_batch=4, protocol="bfcl")
    with session(ExecutionConfig()) as backend:
        trainer = build_trainer(rl_cfg(start, tmp_path), MODEL, BFCL, roll, backend=backend)
        with trainer.engine:
            assert isinstance(trainer.engine, ShardedEngine)  # what the stage holds
            assert trainer.engine.cfg.max_total_tokens == 73_728  # resolved for the profile
            assert trainer._timeout_s() == collective_timeout_s(4, 4, 73_728) == 7372.8


def test_overlong_masks_and_every_reply_ticks_under_the_stage_engine(start, tmp_path):
    """rl.overlong=mask on the stage's engine (it raised AttributeError on step 1): the episodes
    the 760-token budget stopped train nothing, the others keep their mask. And the engine's
    watchers (a launched rank's heartbeat) tick once per model reply: as many ticks as assistant
    messages sampled."""
    roll = RolloutConfig(max_new_tokens=48, max_total_tokens=760, max_steps=3, protocol="bfcl")
    seen = []
    cfg = rl_cfg(start, tmp_path, overlong="mask", tasks_per_step=3)
    with session(ExecutionConfig()) as backend:
        hook = lambda step, out: seen.append((list(out.records), out.rollouts))  # noqa: E731
        trainer = build_trainer(cfg, MODEL, BFCL, roll, backend=backend, on_rollouts=hook)
        ticks = []
        trainer.engine.watch(lambda: ticks.append(1))
        with trainer.engine:
            metrics = trainer.train_step(1)
    ((records, rollouts),) = seen  # the whole episodes and what the update trains on
    stopped = [r.stop_reason == "token_budget" for r in records]
    assert any(stopped) and not all(stopped), stopped  # both kinds in the step
    for cut, record, sampled in zip(stopped, records, rollouts, strict=True):
        assert int(sampled.loss_mask.sum()) == (0 if cut else record.n_sampled)
    replies = sum(m["role"] == "assistant" for r in records for m in r.messages)
    assert len(ticks) == replies > len(records)
    assert metrics["loss/optimizer_steps"] == 1
