"""rcgrpo's BFCL environment in the shape TRL's `GRPOTrainer(environment_factory=...)` wants.

bench/peer_trl.py trains the same RC-GRPO run on rcgrpo and on TRL 1.16; this file is the TRL
side's environment, reward and prompt rows. It imports no TRL, so tests/test_peer_trl.py checks
it in CI, where TRL is not installed.

* `environment_class(tasks)`: one class whose public methods are the tools TRL exposes: every
  public function of the BFCL API classes the tasks involve, plus `done`. A call runs through
  rcgrpo's own `Episode` (the sandbox worker: wall-clock and memory limits, literal arguments,
  fresh API instances per rollout) and returns the observation string rcgrpo's agent loop would
  show, so TRL renders the same tool message. `done()` ends the episode's effects: TRL cannot
  end an episode from a tool, so later calls are answered with an error and not executed.
* `reset(**row)` is called once per rollout (TRL pools one instance per rollout of a group). It
  opens a fresh episode and returns "\\n[Reward Goal: <token>]", which TRL appends to that
  rollout's last user message: rcgrpo's `with_reward_goal` text. The token is drawn per
  rollout, not per prompt (a public attempt draws it once per prompt, so a whole group shares
  one goal and RC-GRPO's point is lost). `GoalDraw` gives rollout j of task t at RL step s the
  token rcgrpo's trainer draws for that slot (training.grpo.rollouts.draw), so both sides
  condition the same rollouts on the same goals.
* `paper_reward`: the reward function (TRL passes `environments=`): the paper's R of each
  rollout's executed calls, scored in one sandbox request (bfcl.checkers.score_many).
* `prompt_rows` / `tool_entries`: the dataset rows (system + "Step 1..n" user message, the task's
  environment name) and the tool list rcgrpo's first prompt shows, so TRL's prompt can be made
  token-identical to rcgrpo's (bench/peer_trl.py checks it).

    .venv/bin/pytest tests/test_peer_trl.py -q
"""

from __future__ import annotations

import importlib

import torch

from rcgrpo.bfcl.environment import Episode
from rcgrpo.bfcl.executor import Call
from rcgrpo.bfcl.instances import backend, public_method_names
from rcgrpo.bfcl.tasks import Task
from rcgrpo.chat.prompts import reward_goal
from rcgrpo.chat.record import HIGH, LOW

DONE_ANSWER = "Done: every later call of this episode is refused."
OVER = "Error during execution: the episode is over (done() was called)"
PROTOCOL = "combined"  # the paper's one-prompt protocol: TRL has no second user turn


class GoalDraw:
    """The reward token of rollout `slot` (0..G-1) of `task_id` at RL step `step` (1-based).

    rcgrpo's trainer draws step s's tasks and the n x G tokens from a generator seeded by
    (seed, s) (rollouts.draw); a task drawn at step s gets its group's tokens from that draw.
    A task that step did not draw (tasks_per_step < number of tasks) gets its own i.i.d. group,
    from a generator seeded by (seed, step, task index): still one token per rollout."""

    def __init__(self, tasks: list[Task], cfg):
        self.tasks, self.cfg = list(tasks), cfg
        self._steps: dict[int, dict[str, list[str]]] = {}

    def group(self, task_id: str, step: int) -> list[str]:
        from rcgrpo.training.grpo.config import step_seed
        from rcgrpo.training.grpo.core_algos import sample_reward_tokens
        from rcgrpo.training.grpo.rollouts import draw

        if step not in self._steps:
            chosen, tokens = draw(self.tasks, self.cfg, step)
            G = self.cfg.group_size
            self._steps[step] = {t.id: tokens[i * G : (i + 1) * G] for i, t in enumerate(chosen)}
        groups = self._steps[step]
        if task_id not in groups:
            index = [t.id for t in self.tasks].index(task_id)
            g = torch.Generator().manual_seed(step_seed(self.cfg.seed, step) * 1009 + index)
            high = sample_reward_tokens(
                1, self.cfg.group_size, self.cfg.p_high, self.cfg.token_sampling, g
            )[0]
            groups[task_id] = [HIGH if h else LOW for h in high.tolist()]
        return groups[task_id]

    def __call__(self, task_id: str, step: int, slot: int) -> str:
        return self.group(task_id, step)[slot]


class BFCLEnvironment:
    """One rollout's BFCL episode, for TRL: `reset` per rollout, one method per tool (added by
    `environment_class`). Everything that is not a tool is private: TRL turns every public
    method but reset / get_reward into a tool."""

    _tasks: dict[str, Task] = {}
    _draw: GoalDraw | None = None
    _created: dict[str, int] = {}  # instances made per task: an instance's slot in its group

    def __init__(self, task_id: str):
        self._task = self._tasks[task_id]
        self._slot = self._created.get(task_id, 0)  # TRL hands out pool[0..G-1] in order
        type(self)._created[task_id] = self._slot + 1
        self._resets = 0  # = the RL step of the current rollout (every task once per step)
        self._episode: Episode | None = None
        self.goal: str | None = None
        self.calls: list[list[str]] = []  # steps of call strings (one call per TRL tool call)
        self.over = False

    def reset(self, **row) -> str:
        """A fresh episode of this row's task; returns the reward goal TRL appends to the user
        message ("\\n[Reward Goal: <|high_reward|>]", as rcgrpo's prompt writes it)."""
        if row.get("task_id", self._task.id) != self._task.id:
            raise ValueError(f"row of {row.get('task_id')} sent to {self._task.id}'s environment")
        self._resets += 1
        self._episode = Episode(self._task, hide_missed=False, step_limit=1_000_000)
        self.calls, self.over = [], False
        self.goal = self._draw(self._task.id, self._resets, self._slot) if self._draw else None
        return "" if self.goal is None else "\n" + reward_goal(self.goal)

    def _call(self, name: str, kwargs: dict) -> str:
        """Run one tool call in the sandboxed episode; rcgrpo's observation string."""
        if self._episode is None:
            raise RuntimeError("reset() was not called")
        if self.over:
            return OVER
        if name == "done":
            self.over = True  # rcgrpo's loop stops here; TRL asks the model again
            return DONE_ANSWER
        step = self._episode.step([Call(name, (), dict(kwargs))])
        self.calls.append([str(c) for c in step.calls])
        return step.observations[0]

    @property
    def task(self) -> Task:
        return self._task


def _tool(name: str):
    def tool(self, **kwargs) -> str:
        return self._call(name, kwargs)

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = f"BFCL function {name!r} (schema: the task's BFCL doc, in the prompt)."
    return tool


def tool_names(tasks: list[Task]) -> list[str]:
    """Every public function of the API classes the tasks involve, and `done`."""
    modules, _ = backend()
    names = {"done"}
    for cls_name in {c for t in tasks for c in t.involved_classes}:
        cls = getattr(importlib.import_module(modules[cls_name]), cls_name)
        names.update(public_method_names(cls))
    return sorted(names)


def environment_class(tasks: list[Task], draw: GoalDraw | None) -> type:
    """A fresh BFCLEnvironment subclass with one method per tool of `tasks` (its own registry
    of tasks and slot counters, so two runs in one process do not share them)."""
    names = tool_names(tasks)
    clash = [n for n in names if hasattr(BFCLEnvironment, n) or n in ("reset", "get_reward")]
    if clash:
        raise ValueError(f"BFCL functions {clash} clash with the environment's own names")
    attrs = {n: _tool(n) for n in names}
    attrs.update(_tasks={t.id: t for t in tasks}, _draw=draw, _created={})
    return type("BFCLToolEnvironment", (BFCLEnvironment,), attrs)


def factories(cls: type, tasks: list[Task]) -> dict:
    """TRL's multi-environment form {name: factory}: one environment name per task, so TRL
    renders each prompt with that task's tools (its `environment` column selects it)."""
    return {t.id: (lambda task_id=t.id: cls(task_id)) for t in tasks}


def paper_reward(environments, **kwargs) -> list[float]:
    """TRL reward function: the paper's R of each rollout's calls (one turn: the combined
    protocol), all rollouts of the batch scored in one request to the sandbox worker."""
    from rcgrpo.bfcl.checkers import score_many

    verdicts = score_many([(e.task, [e.calls]) for e in environments], PROTOCOL)
    return [float(paper.reward) for paper, _ in verdicts]


def first_prompt(task: Task, compact: bool, token: str | None = None):
    """(messages, tools) of rcgrpo's first prompt of `task` (rollout.agent_loop.opening of the
    BFCL episode the agent loop opens)."""
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.rollout.agent_loop import opening

    messages, _, tools = opening(BFCL.episode(task, PROTOCOL), token, compact)
    return messages, tools


def tool_entries(task: Task, compact: bool) -> list[dict]:
    """The `tools=` list rcgrpo's prompt of `task` renders (its docs and done)."""
    return first_prompt(task, compact)[1]


def prompt_rows(tasks: list[Task], compact: bool) -> dict[str, list]:
    """Dataset columns for TRL: prompt (system + user message without a goal), environment
    (the task's environment name) and task_id (passed to reset)."""
    rows = {"prompt": [], "environment": [], "task_id": []}
    for task in tasks:
        rows["prompt"].append(first_prompt(task, compact)[0])
        rows["environment"].append(task.id)
        rows["task_id"].append(task.id)
    return rows
