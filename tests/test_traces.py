"""Episodes as MLflow traces: the episode tree read from a real agent-loop record (hand-counted
tokens and log-probs), sampling, the traces written to a real SQLite store and found again with
`mlflow.search_traces` by task id, reward and goal, the RL and evaluation hooks through the real
Trainer and `evaluate`, the report's trace table, and the model-training experiment kind.

The rollouts are real AgentLoop episodes whose "model" is scripted (the ground truth, a wrong
call, an unparsable call), scored by the real checkers: no model is needed to know the answer.

    .venv/bin/pytest tests/test_traces.py -q
"""

from __future__ import annotations

import json
import time

import pytest
from bfcl_loops import bfcl_loop

from rcgrpo.bfcl.tasks import get_task
from rcgrpo.chat.prompts import Renderer, format_calls
from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.rollout.agent_loop import Limits, results
from rcgrpo.tracking.episodes import episode_tree, is_error, sampled_runs
from rcgrpo.tracking.report import example_traces, traces_markdown
from rcgrpo.tracking.traces import TracesConfig, traced_rollouts, traced_step

TASK = "multi_turn_base_1"  # ls(a=True) | cd, mv | cd, grep | tail: 4 turns
LP = -0.5  # the scripted log-prob of every fed token


@pytest.fixture(scope="module")
def renderer():
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    policy = load_policy(ModelConfig(profile="tiny"))
    return Renderer(policy.tokenizer, policy.stop_id)


def play(renderer, messages: list[str], token=HIGH, protocol="combined"):
    """An episode of TASK whose model says `messages` (each ended by the stop token)."""
    loop = bfcl_loop(get_task(TASK), renderer, protocol, token, Limits(64, 4096, 6), True)
    for text in messages:
        if loop.pending() is None:
            break
        ids = [*renderer.encode(text), renderer.stop_id]
        loop.feed(ids, [LP] * len(ids))
    return loop


def executed(turn) -> list[str]:
    """A ground-truth turn's calls as the executor writes them (normalised spacing)."""
    from rcgrpo.bfcl.executor import parse_calls

    return [str(c) for c in parse_calls(format_calls(list(turn))).calls]


def expert_messages() -> list[str]:
    return [format_calls(list(turn)) for turn in get_task(TASK).ground_truth] + ["[done()]"]


WRONG = ["[ls(a=True)]", "<tool_call>cd(folder='nowhere')</tool_call><tool_call>os.system(1)"
         "</tool_call>", "[done()]"]  # fmt: skip


# -- pure pieces ------------------------------------------------------------------------------


def test_sampled_runs_and_errors_by_hand():
    assert sampled_runs([0, 1, 1, 0, 0, 1, 1, 1], [0, -1, -2, 0, 0, -0.5, -0.5, -1]) == [
        (1, 2, -3.0),
        (5, 3, -2.0),
    ]
    assert sampled_runs([0, 0], [0, 0]) == []
    assert is_error("Error during execution: function 'x' is not available")
    assert is_error('{"error": "cd: nowhere: No such file or directory"}')
    assert not is_error('{"current_working_directory": "workspace"}') and not is_error("ok")


def test_sampling_of_steps_and_groups():
    assert [s for s in range(1, 21) if traced_step(s, 20, 5)] == [1, 6, 11, 16, 20]
    assert [s for s in range(1, 4) if traced_step(s, 3, 1)] == [1, 2, 3]
    assert not any(traced_step(s, 20, 0) for s in range(1, 21))
    assert list(traced_rollouts(10, 5, 1)) == [0, 1, 2, 3, 4]
    assert list(traced_rollouts(10, 5, 0)) == list(range(10))  # 0 = every group
    assert list(traced_rollouts(10, 5, 7)) == list(range(10))


def score_loops(loops):
    """The finished loops' rollouts, scored in one batch by BFCL's scorer of their protocol."""
    return results(loops, BFCL.scorer(loops[0].protocol))


def test_tree_counts_tokens_calls_and_observations(renderer):
    (r,) = score_loops([play(renderer, WRONG)])
    turns = episode_tree(r)
    assert len(turns) == 1 and turns[0].user.endswith("[Reward Goal: <|high_reward|>]")
    msgs = turns[0].messages
    assert [m.text for m in msgs] == WRONG
    for m, text in zip(msgs, WRONG, strict=True):  # every fed token, the stop included
        n = len(renderer.encode(text)) + 1
        assert m.tokens == n and m.logprob_sum == pytest.approx(LP * n)
    assert msgs[0].context_tokens == r.prompt_len  # the first message continues the prompt
    assert sum(m.tokens for m in msgs) == sum(r.mask)
    assert msgs[0].inputs == [{"role": "user", "content": turns[0].user}]
    ls = msgs[0].calls[0]
    assert (ls.name, ls.error) == ("ls", False) and "workspace" in ls.observation
    cd = msgs[1].calls[0]
    assert (cd.call, cd.error) == ("cd(folder='nowhere')", True) and "nowhere" in cd.observation
    assert msgs[1].inputs == [{"role": "tool", "content": ls.observation}]
    assert len(msgs[1].parse_errors) == 1 and "bare name" in msgs[1].parse_errors[0]
    done = msgs[2].calls[0]  # the episode ended on it: never shown an observation
    assert done.name == "done" and done.observation is None


def test_tree_of_the_turn_by_turn_protocol(renderer):
    task = get_task(TASK)
    script = [m for turn in task.ground_truth for m in (format_calls(list(turn)), "Done.")]
    (r,) = score_loops([play(renderer, script, protocol="bfcl")])
    turns = episode_tree(r)
    assert len(turns) == len(task.turns) and r.reward == 1
    assert [len(t.messages) for t in turns] == [2] * len(task.turns)  # the calls, then prose
    assert turns[1].user == task.turns[1][-1]["content"]
    assert [c.call for c in turns[3].messages[0].calls] == executed(task.ground_truth[3])


# -- writing and finding ----------------------------------------------------------------------


def scored(renderer):
    """(success under high, failure under low): real episodes, scored by the checkers."""
    good, bad = score_loops([play(renderer, expert_messages()), play(renderer, WRONG, LOW)])
    assert (good.reward, bad.reward) == (1, 0)
    return good, bad


def spans_of(trace) -> dict[str, list]:
    out: dict[str, list] = {}
    for s in trace.data.spans:
        out.setdefault(s.span_type, []).append(s)
    return out


def test_evaluation_episodes_are_traces_found_by_task_reward_and_goal(renderer, mlflow_store):
    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import evaluate
    from rcgrpo.tracking import runs as tracking
    from rcgrpo.tracking.traces import EpisodeTracer, eval_hook, find_traces

    good, bad = scored(renderer)

    class Scripted:  # the evaluation's engine: real episodes, the model's part scripted
        def rollout(self, tasks, tokens, protocol, seed):
            script = {HIGH: expert_messages(), LOW: WRONG}
            return score_loops([play(renderer, script[t], t) for t in tokens])

    with tracking.start_run("eval_rl_tasks_after") as run:
        run_id = run.info.run_id
        tracer = EpisodeTracer(run_id, TracesConfig(), {"variant": "rctp+rc-grpo"})
        cfg = EvalConfig(split="train", protocol="combined", other_protocol=False,
                         tokens=("high", "low"), out_dir=str(mlflow_store / "eval"))  # fmt: skip
        evaluate(Scripted(), cfg, tasks=[get_task(TASK)], on_rollouts=eval_hook(tracer, "eval_rl_tasks_after"), environment=BFCL)  # fmt: skip
    assert [t["outcome"] for t in tracer.written] == ["success", "failure"]
    assert tracer.metrics()["traces/episodes"] == 2 and tracer.failed == 0

    hits = find_traces(run_id, task_id=TASK, reward="1", goal="high")
    assert [t.info.trace_id for t in hits] == [tracer.written[0]["trace_id"]]
    (miss,) = find_traces(run_id, task_id=TASK, reward="0", goal="low")
    assert miss.info.trace_id == tracer.written[1]["trace_id"]
    assert find_traces(run_id, task_id="multi_turn_base_2") == []
    import mlflow

    assert len(mlflow.search_traces(locations=[hits[0].info.experiment_id], run_id=run_id,
                                    return_type="list")) == 2  # fmt: skip
    t = hits[0]
    assert t.info.trace_metadata["mlflow.sourceRun"] == run_id  # linked to the run
    assert (
        t.info.tags["variant"] == "rctp+rc-grpo" and t.info.tags["stage"] == "eval_rl_tasks_after"
    )
    assert (t.info.state.value, miss.info.state.value) == ("OK", "ERROR")  # failures stand out
    kinds = spans_of(t)
    (root,) = kinds["AGENT"]
    assert root.inputs["reward_goal"] == HIGH and root.outputs["reward"] == 1
    assert root.attributes["task_id"] == TASK and root.attributes["goal"] == "high"
    assert len(kinds["CHAIN"]) == 1 and len(kinds["LLM"]) == len(expert_messages())
    tree = episode_tree(good)
    assert [s.attributes["tokens"] for s in kinds["LLM"]] == [m.tokens for m in tree[0].messages]
    calls = [c for turn in get_task(TASK).ground_truth for c in executed(turn)]
    assert [s.inputs["call"] for s in kinds["TOOL"]] == [*calls, "done()"]
    assert all(s.status.status_code == "OK" for s in kinds["TOOL"])
    bad_tools = spans_of(miss)["TOOL"]
    cd = next(s for s in bad_tools if s.inputs["call"] == "cd(folder='nowhere')")
    assert cd.status.status_code == "ERROR" and "nowhere" in cd.outputs["observation"]
    assert (
        spans_of(miss)["AGENT"][0].outputs["reason"]
        == bad.trajectory.reward_reason["paper"]["reason"]
    )


def test_rl_hook_traces_sampled_steps_with_what_was_trained(renderer, mlflow_store):
    """The Trainer hands the hook the batch it trains on; the hook traces steps 1 and the last
    (rl_every 2 of 3 steps), first group only, with step, policy version and advantage."""
    import torch
    from test_trainer import make

    from rcgrpo.tracking import runs as tracking
    from rcgrpo.tracking.traces import EpisodeTracer, rl_hook
    from rcgrpo.training.grpo.rollouts import Sampled, StepRollouts

    seen = []
    trainer = make(mlflow_store / "rl", steps=3)
    trainer.on_rollouts = lambda step, out: seen.append((step, out.rewards.mean().item(),
                                                         len(out.records), out.first))  # fmt: skip
    history = trainer.train()
    assert [s[0] for s in seen] == [1, 2, 3]
    assert {s[2:] for s in seen} == {(12, 0)}  # the whole rollouts the update's tensors came from
    assert [s[1] for s in seen] == pytest.approx([h["reward/mean"] for h in history])

    good, bad = scored(renderer)
    with tracking.start_run("rl") as run:
        tracer = EpisodeTracer(run.info.run_id, TracesConfig(rl_every=2, rl_groups=1))
        hook = rl_hook(tracer, steps=3, group_size=2)
        for step in (1, 2, 3):
            whole = [good, bad, good, bad]
            out = StepRollouts([get_task(TASK)] * 2, [HIGH, LOW, HIGH, LOW],
                               [Sampled.of(r) for r in whole], [(1, 1), (0, 0)] * 2,
                               torch.tensor([[1.0, 0.0]] * 2), torch.tensor([1.0, -1.0] * 2), 0.25,
                               4, records=whole, first=0)  # fmt: skip
            hook(step, out)
    assert [(t["rl_step"], t["goal"], t["group"]) for t in tracer.written] == [
        ("1", "high", "0"), ("1", "low", "0"), ("3", "high", "0"), ("3", "low", "0"),
    ]  # fmt: skip
    from rcgrpo.tracking.traces import find_traces

    (t,) = find_traces(run.info.run_id, rl_step="3", outcome="failure")
    root = spans_of(t)["AGENT"][0]
    assert root.attributes["advantage"] == -1.0 and root.attributes["policy_version"] == 2
    assert t.info.execution_duration == (bad.timing["end"] - bad.timing["start"]) // 1_000_000


def test_a_failing_store_does_not_stop_training(renderer, mlflow_store):
    from rcgrpo.tracking import runs as tracking
    from rcgrpo.tracking.traces import EpisodeTracer

    good, _ = scored(renderer)
    with tracking.start_run("rl") as run:
        tracer = EpisodeTracer(run.info.run_id, TracesConfig())
    tracer.experiment_id = "999999"  # no such experiment: the store refuses the trace
    window = (time.time_ns(), time.time_ns() + 1)
    with pytest.warns(UserWarning, match="not written"):
        tracer.write([(good, "x", {}, {"task_id": TASK}, window)])
    assert tracer.failed == 1 and tracer.written == []


# -- report, URLs, experiment kind -------------------------------------------------------------


def test_call_windows_by_hand():
    """Measured calls end to end; a killed call (None) takes what is left of the step."""
    from rcgrpo.tracking.episodes import call_windows

    assert call_windows(0, 100, [10e-9, 20e-9]) == [(0, 10), (10, 30)]
    assert call_windows(0, 100, [10e-9, None, None]) == [(0, 10), (10, 55), (55, 100)]
    assert call_windows(5, 5, []) == []


def test_timed_spans_are_measured_per_message_and_call(renderer, mlflow_store):
    """A real episode whose "model" takes a different pause before each message: its LLM spans
    last at least those pauses, its TOOL spans are the worker's own times (not equal slices),
    no two children overlap, and all lie within the episode's measured wall time."""
    from rcgrpo.tracking import runs as tracking
    from rcgrpo.tracking.traces import EpisodeTracer, find_traces

    pauses = [0.02, 0.06, 0.01, 0.04, 0.03]  # seconds before each of the 5 messages
    started = time.time_ns()
    loop = bfcl_loop(get_task(TASK), renderer, "combined", HIGH, Limits(64, 4096, 6), True)
    for text, pause in zip(expert_messages(), pauses, strict=True):
        time.sleep(pause)
        ids = [*renderer.encode(text), renderer.stop_id]
        loop.feed(ids, [LP] * len(ids))
    (good,) = score_loops([loop])
    ended = time.time_ns()
    with tracking.start_run("eval") as run:
        tracer = EpisodeTracer(run.info.run_id, TracesConfig())
        batch = (ended, ended + 10**10)  # a batch window the measured spans must not use
        tracer.write([(good, "timed", {}, {"task_id": TASK}, batch)])
    (t,) = find_traces(run.info.run_id)
    kinds = spans_of(t)
    (root,) = kinds["AGENT"]
    assert started <= root.start_time_ns < root.end_time_ns <= ended

    def ms(span) -> float:
        return (span.end_time_ns - span.start_time_ns) / 1e6

    llm = sorted(kinds["LLM"], key=lambda s: s.start_time_ns)
    assert [ms(s) >= p * 1e3 for s, p in zip(llm, pauses, strict=True)] == [True] * 5
    assert len({ms(s) for s in llm}) == 5
    tools = [s for s in kinds["TOOL"] if s.inputs["call"] != "done()"]  # done() never runs
    assert len(tools) == 6 and all(ms(s) > 0 for s in tools) and len({ms(s) for s in tools}) > 1
    children = sorted(llm + kinds["TOOL"], key=lambda s: s.start_time_ns)
    for before, after in zip(children, children[1:], strict=False):
        assert before.end_time_ns <= after.start_time_ns  # in order, never overlapping
    assert sum(ms(s) for s in children) <= ms(root)
    assert t.info.execution_duration == int(ms(root))


def test_report_names_one_success_and_one_failure_per_task():
    def t(i, task, goal, outcome):
        return {"trace_id": f"tr-{i:032x}", "url": f"u{i}", "task_id": task, "goal": goal,
                "outcome": outcome}  # fmt: skip

    before = [
        t(1, "a", "low", "failure"),
        t(2, "a", "high", "failure"),
        t(3, "a", "low", "success"),
    ]
    after = [t(4, "a", "high", "success"), t(5, "b", "high", "success")]
    picks = example_traces(before, "high")
    assert picks["a"]["failure"]["trace_id"] == before[1]["trace_id"]  # the headline goal first
    assert picks["a"]["success"]["goal"] == "low"  # else the other goal
    text = "\n".join(traces_markdown({"before": before, "after": after}, "high"))
    row_a = next(ln for ln in text.splitlines() if ln.startswith("| a |"))
    assert row_a == (f"| a | [{'tr-' + '0' * 8}](u3) (low) | [{'tr-' + '0' * 8}](u2) | "
                     f"[{'tr-' + '0' * 8}](u4) | - |")  # fmt: skip
    assert "| b | - | - |" in text


def test_experiment_is_a_model_training_one_and_links_open_that_view(mlflow_store):
    from mlflow.tracking import MlflowClient

    from rcgrpo.tracking import registry
    from rcgrpo.tracking import runs as tracking

    client = MlflowClient(tracking.tracking_uri())
    client.create_experiment("rcgrpo")  # a store made before the tag existed
    eid = tracking.configure()
    assert client.get_experiment(eid).tags["mlflow.experimentKind"] == "custom_model_development"
    with tracking.start_run("rl") as run:
        pass
    rid = run.info.run_id
    view = "workflowType=machine_learning"
    assert registry.experiment_url(eid) == f"http://127.0.0.1:5000/#/experiments/{eid}/runs?{view}"
    assert registry.run_url(rid, page="model-metrics").endswith(f"/runs/{rid}/model-metrics?{view}")
    assert registry.trace_url(rid, "tr-1").endswith(f"/traces?{view}&selectedEvaluationId=tr-1")
    json.dumps(TracesConfig().__dict__)  # plain values: goes into the run's config.json
