"""bench/peer_trl.py's two claims, checked: TRL's side runs the same experiment (the environment,
the goals, the prompt), and rcgrpo's advantages and per-token loss equal what TRL 1.16 computes
with the matching settings.

The environment tests need no TRL and run in CI. The equality tests call TRL's own code paths
(its advantage in `GRPOTrainer._generate_and_score_completions`, its loss in `_compute_loss`)
on given tensors and run where the extra is installed (`pip install -e ".[peer]"`); CI does not
install it, so there they are skipped with that reason. Tolerance 1e-6 on loss and gradient.

    .venv/bin/pytest tests/test_peer_trl.py -q
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import peer_trl as bench  # noqa: E402
import peer_trl_env as penv  # noqa: E402

from rcgrpo.bfcl.replay import parse_call_string  # noqa: E402
from rcgrpo.bfcl.tasks import get_task  # noqa: E402
from rcgrpo.chat.record import HIGH, LOW  # noqa: E402
from rcgrpo.training.grpo.config import RLConfig  # noqa: E402
from rcgrpo.training.grpo.core_algos import group_advantages, policy_loss  # noqa: E402
from rcgrpo.training.grpo.rollouts import draw  # noqa: E402

needs_trl = pytest.mark.skipif(
    importlib.util.find_spec("trl") is None,
    reason='TRL is not installed (pip install -e ".[peer]"; CI does not install it)',
)
TASKS = ("multi_turn_base_4", "multi_turn_base_11")  # two of the CPU default's RL tasks


def rollout_group(cls, task_id: str, G: int) -> list:
    """G instances of a task's environment, made in the order TRL's pool makes them."""
    return [penv.factories(cls, [get_task(task_id)])[task_id]() for _ in range(G)]


# -- the environment (no TRL) ------------------------------------------------------------------
def test_reset_draws_each_rollouts_own_goal_as_rcgrpo_draws_it():
    tasks = [get_task(t) for t in TASKS]
    cfg = RLConfig(group_size=5, tasks_per_step=2, steps=4, seed=3)
    cls = penv.environment_class(tasks, penv.GoalDraw(tasks, cfg))
    pools = {t.id: rollout_group(cls, t.id, cfg.group_size) for t in tasks}
    mixed = 0
    for step in range(1, cfg.steps + 1):
        chosen, tokens = draw(tasks, cfg, step)  # what rcgrpo's trainer conditions on
        for i, task in enumerate(chosen):
            texts = [env.reset(task_id=task.id, prompt=[]) for env in pools[task.id]]
            goals = [env.goal for env in pools[task.id]]
            assert goals == tokens[i * cfg.group_size : (i + 1) * cfg.group_size]
            assert texts == [f"\n[Reward Goal: {g}]" for g in goals]
            mixed += len(set(goals)) == 2
    assert mixed >= 4  # a group holds both goals: drawn per rollout, not once per prompt


def test_goal_draw_covers_tasks_a_step_did_not_draw():
    tasks = [get_task(t) for t in TASKS]
    cfg = RLConfig(group_size=5, tasks_per_step=1, steps=2, seed=0)
    goals = penv.GoalDraw(tasks, cfg)
    (picked,), _ = draw(tasks, cfg, 1)
    other = next(t.id for t in tasks if t.id != picked.id)
    group = [goals(other, 1, j) for j in range(5)]
    assert set(group) <= {HIGH, LOW} and group == [goals(other, 1, j) for j in range(5)]


def test_tools_run_in_rcgrpo_episode_and_score_with_the_paper_reward():
    task = get_task(TASKS[0])
    cls = penv.environment_class([task], None)
    solved, short = rollout_group(cls, task.id, 2)
    truth = [parse_call_string(c) for turn in task.ground_truth for c in turn]
    reference = penv.Episode(task, hide_missed=False)  # rcgrpo's own episode, same calls
    for env in (solved, short):
        assert env.reset(task_id=task.id) == ""  # no GoalDraw: no goal text
    for call in truth:
        observation = getattr(solved, call.name)(**call.kwargs)  # as TRL calls a tool
        assert observation == reference.step([call]).observations[0]
    for call in truth[:-1]:
        getattr(short, call.name)(**call.kwargs)
    assert short.done() == penv.DONE_ANSWER
    last = truth[-1]
    assert getattr(short, last.name)(**last.kwargs) == penv.OVER  # after done(): not executed
    assert solved.calls == [[str(c)] for c in truth] and len(short.calls) == len(truth) - 1
    assert penv.paper_reward([solved, short]) == [1.0, 0.0]
    assert "done" in penv.tool_names([task]) and "reset" not in penv.tool_names([task])


def test_trl_rendering_of_the_rows_is_rcgrpo_first_prompt():
    """What TRL's _tokenize_prompts does with a row (goal appended by reset, the task's tool
    entries as tools) gives rcgrpo's first prompt, token for token (qwen-shape tokenizer)."""
    from rcgrpo.chat.prompts import Renderer
    from rcgrpo.models.qwen_shape import build_tokenizer

    tok = build_tokenizer()
    renderer = Renderer(tok, tok.convert_tokens_to_ids("<|im_end|>"))
    tasks = [get_task(t) for t in TASKS]
    rows = penv.prompt_rows(tasks, compact=True)
    for i, task in enumerate(tasks):
        prompt = rows["prompt"][i]
        prompt = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + "\n"
                                 + f"[Reward Goal: {HIGH}]"}]  # fmt: skip
        trl_ids = tok.apply_chat_template(
            [prompt], tools=penv.tool_entries(task, True), add_generation_prompt=True,
            tokenize=True, return_dict=True,
        )["input_ids"][0]  # fmt: skip
        assert list(trl_ids) == renderer.prompt(*penv.first_prompt(task, True, HIGH))
        assert rows["environment"][i] == rows["task_id"][i] == task.id


def test_json_form_keeps_the_calls():
    from rcgrpo.bfcl.executor import parse_calls
    from rcgrpo.envs.bfcl.experts import expert

    record = expert(get_task(TASKS[0]), "combined", "train")
    converted = bench.json_form(record)
    for old, new in zip(record.messages, converted.messages, strict=True):
        if old.get("tool_calls"):
            assert new["content"].startswith("<tool_call>\n{")
            assert [str(c) for c in parse_calls(new["content"]).calls] == [
                str(parse_call_string(c)) for c in old["tool_calls"]
            ]
        else:
            assert new == old


# -- TRL's own advantage and loss, on given tensors --------------------------------------------
def make_trainer(policy, tmp_path, *, G: int, B: int, **config):
    """A real GRPOTrainer (tiny profile) whose loss / advantage code the tests call directly.
    beta=0 at construction (no reference model is loaded); _compute_loss reads self.beta."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False,
        activation_checkpointing=False, save_strategy="no", disable_tqdm=True,
        per_device_train_batch_size=B, gradient_accumulation_steps=1, num_generations=G,
        num_iterations=1, max_completion_length=16, beta=0.0, **config,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=policy.model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args, train_dataset=Dataset.from_dict({"prompt": ["x"] * B}),
        processing_class=policy.tokenizer,
    )  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop otherwise
    trainer.model.train()
    return trainer


def trl_advantages(trainer, rewards: torch.Tensor) -> torch.Tensor:
    """TRL's advantages of rewards (n_groups, G): its generation is replaced by fixed ids and
    its reward functions by `rewards`; nothing else runs a forward (beta 0, one iteration)."""
    flat = rewards.flatten()[:, None]  # (B, 1): one reward function
    B = flat.shape[0]
    trainer.beta, trainer.reward_weights = 0.0, torch.ones(1)
    trainer._generate = lambda prompts: ([[3]] * B, [[1, 2]] * B, None, ["c"] * B, None, {},
                                         None, [])  # fmt: skip
    trainer._calculate_rewards = lambda inputs, prompts, completions, ids: flat
    return trainer._generate_and_score_completions([{"prompt": "x"}] * B)["advantages"]


def trl_loss(trainer, logp, old, adv, mask, ref, beta: float) -> torch.Tensor:
    """TRL's scalar loss for per-token log-probs logp (B, T) (a leaf: its .grad is compared)."""
    B, T = logp.shape
    trainer.beta = beta
    trainer._get_per_token_logps_and_entropies = types.MethodType(
        lambda self, *a, **k: (logp, torch.zeros_like(logp), None), trainer
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.long(), "advantages": adv, "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(), "ref_per_token_logps": ref,
    }  # fmt: skip
    return trainer._compute_loss(trainer.model, inputs)


@pytest.fixture(scope="module")
def tiny():
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    return load_policy(ModelConfig())


G, GROUPS, T = 5, 3, 9
BETA, EPS = 0.1, 0.2  # the paper's beta and clip


def batch(seed: int = 0):
    """Rewards (3 groups of 5: mixed, zero-variance, fractional) and off-policy tensors whose
    ratios leave [0.8, 1.2], so the clip acts; |log r| to the reference stays small."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.tensor([[0.0, 1, 1, 0, 1], [1, 1, 1, 1, 1], [0, 0.5, 1, 0.25, 0]])
    mask = (torch.rand(GROUPS * G, T, generator=g) > 0.25).long()
    mask[:, 0] = 1
    old = -torch.rand(GROUPS * G, T, generator=g) * 3
    logp = old + 0.4 * torch.randn(GROUPS * G, T, generator=g)
    ref = old + 0.3 * torch.randn(GROUPS * G, T, generator=g)
    return rewards, mask, old, logp, ref


@needs_trl
def test_advantages_equal_trl_group_scaling_up_to_its_documented_std(tiny, tmp_path):
    rewards = batch()[0]
    none = trl_advantages(make_trainer(tiny, tmp_path, G=G, B=15, scale_rewards="none"), rewards)
    assert torch.allclose(none, group_advantages(rewards, "mean").flatten(), atol=1e-6)
    trl = trl_advantages(make_trainer(tiny, tmp_path, G=G, B=15, scale_rewards="group"), rewards)
    centred = group_advantages(rewards, "mean")  # (3, 5)
    ours = group_advantages(rewards, "grpo")
    # TRL: centred / (sample std + 1e-4); rcgrpo: centred / (population std + 1e-6), 0 if std 0
    sample = rewards.std(1, unbiased=True, keepdim=True)
    assert torch.allclose(trl, (centred / (sample + 1e-4)).flatten(), atol=1e-6)
    population = rewards.std(1, unbiased=False, keepdim=True)
    assert torch.allclose((ours * (population + 1e-6)).flatten(), centred.flatten(), atol=1e-6)
    # so for a mixed group TRL's advantage is rcgrpo's times (pop + 1e-6) / (sample + 1e-4),
    # ~sqrt((G-1)/G) = 0.894 at G = 5; a zero-variance group is 0 on both sides
    ratio = (trl.view(GROUPS, G) / ours.masked_fill(ours == 0, 1))[[0, 2]]
    assert torch.allclose(ratio, ((population + 1e-6) / (sample + 1e-4))[[0, 2]].expand(2, G))
    assert abs(ratio[0, 0].item() - (4 / 5) ** 0.5) < 1e-3
    assert (trl.view(GROUPS, G)[1] == 0).all() and (ours[1] == 0).all()


@needs_trl
@pytest.mark.parametrize(
    "loss_type, aggregation", [("bnpo", "token-mean"), ("dapo", "token-mean"), ("grpo", "seq-mean")]
)
def test_loss_and_gradient_equal_trl(tiny, tmp_path, loss_type, aggregation):
    rewards, mask, old, logp0, ref = batch(1)
    adv = group_advantages(rewards, "grpo").flatten()  # the same advantages on both sides
    trainer = make_trainer(tiny, tmp_path, G=G, B=15, loss_type=loss_type, epsilon=EPS,
                           scale_rewards="group", use_bias_correction_kl=False)  # fmt: skip
    mine, theirs = logp0.clone().requires_grad_(), logp0.clone().requires_grad_()
    loss, stats = policy_loss(mine, old, adv, mask, ref, clip_eps=EPS, kl_coef=BETA,
                              kl_estimator="k3", aggregation=aggregation)  # fmt: skip
    trl = trl_loss(trainer, theirs, old, adv, mask, ref, BETA)
    loss.backward()
    trl.backward()
    assert stats["clip_frac"] > 0.1  # the clip acts on both sides
    assert abs(loss.item() - trl.item()) < 1e-6, (loss.item(), trl.item())
    assert (mine.grad - theirs.grad).abs().max().item() < 1e-6


@needs_trl
def test_settings_without_trl_equivalent_differ_as_documented(tiny, tmp_path):
    """The bench's docstring lists these: pinned here so a change on either side shows."""
    rewards, mask, old, logp0, ref = batch(2)
    adv = group_advantages(rewards, "grpo").flatten()

    def both(trainer, ref_logp, aggregation="token-mean"):
        ours, _ = policy_loss(logp0, old, adv, mask, ref_logp, clip_eps=EPS, kl_coef=BETA,
                              kl_estimator="k3", aggregation=aggregation)  # fmt: skip
        return ours.item(), trl_loss(trainer, logp0, old, adv, mask, ref_logp, BETA).item()

    plain = make_trainer(tiny, tmp_path, G=G, B=15, loss_type="bnpo", epsilon=EPS,
                         use_bias_correction_kl=False)  # fmt: skip
    far = ref.clone()
    far[0, 0] = logp0[0, 0] + 4.0  # log r = 4: k3 = e^4 - 5 = 49.6, rcgrpo clamps it to 10
    ours, theirs = both(plain, far)
    n = mask.sum().item()
    assert abs((theirs - ours) - BETA * (49.598150 - 10) / n) < 1e-4
    biased = make_trainer(tiny, tmp_path, G=G, B=15, loss_type="bnpo", epsilon=EPS)
    ours, theirs = both(biased, ref)  # TRL's default: k3 x ratio
    assert abs(ours - theirs) > 1e-6
    mask[0] = 0  # an all-masked rollout: rcgrpo's seq-mean skips it, TRL's "grpo" counts a 0
    seq = make_trainer(tiny, tmp_path, G=G, B=15, loss_type="grpo", epsilon=EPS,
                       use_bias_correction_kl=False)  # fmt: skip
    ours, theirs = both(seq, ref, "seq-mean")
    assert abs(theirs - ours * 14 / 15) < 1e-6


@needs_trl
@pytest.mark.slow
def test_trl_trains_over_the_environment_with_rcgrpo_prompts(tmp_path):
    """One TRL step through environment_factory as the bench builds it (random qwen-shape start,
    2 tasks x G = 2): its prompts are rcgrpo's token for token, each rollout carries its own
    drawn goal, and the step trains."""
    import peer_trl_runs as runs

    from rcgrpo.models.loading import load_policy, save_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig

    model_cfg = ModelConfig(profile="qwen-shape", lora=False, compact_docs=True)
    start = save_policy(load_policy(model_cfg), tmp_path / "start")
    tasks = [get_task(t) for t in TASKS]
    cfg = RLConfig(group_size=2, tasks_per_step=2, steps=1, mini_batch_size=4,
                   micro_batch_size=4, lr=1e-4, seed=0)  # fmt: skip
    rollout_cfg = RolloutConfig(max_new_tokens=8, max_total_tokens=1536, max_steps=2)
    trainer, policy = runs.trl_trainer(start, tasks, cfg, rollout_cfg, model_cfg, tmp_path, 64)
    runs.check_prompts(trainer, policy, tasks)  # raises on the first prompt that differs
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.checked_prompts == 4
    goals = penv.GoalDraw(tasks, cfg)
    by_task = {}
    for env in trainer.environments:
        by_task.setdefault(env.task.id, []).append(env.goal)
    assert by_task == {t: [goals(t, 1, 0), goals(t, 1, 1)] for t in TASKS}
    logged = trainer.state.log_history[0]
    assert "reward" in logged and torch.isfinite(torch.tensor(logged["loss"]))
