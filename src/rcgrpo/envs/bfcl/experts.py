"""Expert trajectories: the BFCL ground truth of each task played in a real `Episode`.

`play(task, calls, protocol)` executes any call structure (turn -> step -> call strings) and
returns the chat messages with the *real* observations the environment produced; failures.py
re-plays its perturbations through the same function, so experts and failures look alike except
for what the calls did. Two protocols:

* "bfcl": turn by turn, miss_func functions hidden until their reveal turn; each turn's calls are
  one assistant step followed by one tool message per call, then a plain-text assistant reply that
  ends the turn (BFCL's turn ends on a message without calls).
* "combined": the paper's training prompt, every user turn merged into one "Step 1: ... Step n:"
  message; one assistant step per non-empty ground-truth turn, then a final `done()` call.

Every expert is scored with both checkers; the data stage keeps one that does not earn paper
reward 1 out of the high set and lists it with the checker's reason in the dataset manifest
(rcgrpo.data.generate), never dropping it silently.

    .venv/bin/python -c "from rcgrpo.envs.bfcl.experts import *; from rcgrpo.bfcl.tasks import get_task; print(expert(get_task('multi_turn_base_0'), 'combined').messages[:3])"
"""

from __future__ import annotations

from rcgrpo.bfcl.checkers import ground_truth_calls, score
from rcgrpo.bfcl.environment import Episode
from rcgrpo.bfcl.executor import CallError
from rcgrpo.bfcl.replay import parse_call_string
from rcgrpo.bfcl.tasks import Task
from rcgrpo.chat.record import Provenance, Trajectory

DONE = "done()"
# The text an expert answers with when a turn needs no call (miss_param asks for the value,
# miss_func says it lacks the function) and the reply that closes a turn after its calls.
NO_CALL_REPLY = (
    "I cannot complete this request with the functions and information I have. "
    "Please provide the missing function or details."
)
TURN_DONE_REPLY = "I have completed this step of the request."


def combined_prompt(task: Task) -> str:
    """All user turns as one "Step 1: ... Step n: ..." message: the episode's own prompt
    (`episode.combined_request`), so experts and rollouts read the same request."""
    from rcgrpo.envs.bfcl.episode import combined_request

    return combined_request(list(task.turns))


def _assistant_step(call_texts: list[str]) -> dict:
    # Same text as a step of calls is written (prompts.format_calls).
    return {"role": "assistant", "content": f"[{', '.join(call_texts)}]", "tool_calls": call_texts}


def _execute(episode: Episode, call_texts: list[str]) -> list[dict]:
    """One assistant step and its tool messages (unparseable strings become error messages)."""
    parsed, names = [], []
    for text in call_texts:
        try:
            parsed.append(parse_call_string(text))
            names.append(parsed[-1].name)
        except CallError as e:  # a stored call that does not parse: keep the evidence visible
            raise ValueError(f"{episode.task.id}: call {text!r} does not parse: {e}") from None
    step = episode.step(parsed)
    tools = [
        {"role": "tool", "name": name, "content": obs}
        for name, obs in zip(names, step.observations, strict=True)
    ]
    return [_assistant_step(call_texts), *tools]


def play(task: Task, calls: list[list[list[str]]], protocol: str) -> list[dict]:
    """Execute `calls` in a fresh episode and return the messages with real observations.

    bfcl: `calls` has one entry per task turn. combined: one turn whose steps are executed in
    order; a trailing `done()` step is not executed (it ends the episode, it is no API call).
    """
    if protocol == "bfcl":
        if len(calls) != len(task.turns):
            raise ValueError(f"{task.id}: {len(calls)} turns of calls for {len(task.turns)} turns")
        episode = Episode(task, hide_missed=True)
        messages: list[dict] = []
        for turn, steps in enumerate(calls):
            messages += episode.begin_turn(turn)
            steps = [s for s in steps if s]
            for step in steps:
                messages += _execute(episode, step)
            reply = TURN_DONE_REPLY if steps else NO_CALL_REPLY
            messages.append({"role": "assistant", "content": reply})
        return messages
    if protocol == "combined":
        if len(calls) != 1:
            raise ValueError(
                f"{task.id}: the combined protocol has 1 turn of calls, not {len(calls)}"
            )
        # One turn holding every step: nothing is hidden (all functions are listed at once).
        episode = Episode(task, hide_missed=False, step_limit=10_000)
        episode.begin_turn(0)
        messages = [{"role": "user", "content": combined_prompt(task)}]
        for step in calls[0]:
            if step == [DONE]:
                messages.append(_assistant_step([DONE]))
                break
            messages += _execute(episode, step)
        return messages
    raise ValueError(f"protocol must be 'bfcl' or 'combined', got {protocol!r}")


def expert_calls(task: Task, protocol: str) -> list[list[list[str]]]:
    """The ground truth in the protocol's call layout (combined: one turn, then done())."""
    per_turn = ground_truth_calls(task)
    if protocol == "combined":
        return [[step for turn in per_turn for step in turn] + [[DONE]]]
    return per_turn


def scored(
    task: Task, split: str, protocol: str, calls, provenance: Provenance, **reason
) -> Trajectory:
    """Play `calls`, score them with both checkers and build the record."""
    messages = play(task, calls, protocol)
    paper, bfcl = score(task, calls, protocol)
    return Trajectory(
        task_id=task.id,
        category=task.category,
        split=split,
        protocol=protocol,
        messages=messages,
        calls=calls,
        reward=paper.reward,
        checks={"paper": paper.reward, "bfcl": bfcl.reward},
        provenance=provenance,
        reward_reason={"paper": paper.reason, "bfcl": bfcl.reason, **reason},
    )


def expert(task: Task, protocol: str, split: str = "train") -> Trajectory:
    """The ground truth of `task` as a scored trajectory."""
    return scored(
        task, split, protocol, expert_calls(task, protocol), Provenance("expert", seed=None)
    )
