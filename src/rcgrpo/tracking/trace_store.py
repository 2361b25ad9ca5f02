"""Recorded episodes written as MLflow traces, many at a time, linked to the run that made them.

`write_traces(experiment_id, run_id, episodes)` turns each (rollout, attributes, tags, window)
into one trace: a root AGENT span for the episode (inputs: task, reward goal, prompt; outputs:
rewards, checker reasons, stop reason), a CHAIN span per turn, an LLM span per model message
(sampled tokens, log-prob sum, context length as MLflow's token usage) and a TOOL span per call
(the parsed call in, the observation out, status ERROR for an error observation). The trace
metadata `mlflow.sourceRun` links it to the run (the run's Traces tab, `search_traces(run_id=)`);
the tags make it searchable (`tags.task_id = '...' AND tags.reward = '1'`). An episode that
failed (reward 0; BFCL: paper R = 0) has the trace state ERROR with the checker's reason, so failures stand out
in the UI's trace list; the state says nothing about the code, which ran either way.

Why not MLflow's span API (`MlflowClient.start_trace/start_span`): it exports span by span
through an async queue, one database transaction per few spans, ~60-115 ms per 20-span trace
on the 2-core box, and needs a flush at the end. Here the spans of a whole batch are built in
memory in MLflow's own span schema (`Span.from_dict`, the format of exported trace JSON) and
stored with one `log_spans` call plus one `start_trace` per trace, synchronously: ~13 ms per
trace (bench/traces.py).

Times are measured, not laid out: the agent loop records when each model message was asked for
and came back and the tool worker times each call (rcgrpo.rollout.clock). The root span is the
episode's own wall time, an LLM span is its message's time in the engine (queued with the
batch, then generated), the TOOL spans follow it, as its siblings in the turn, with the time
each call took in the worker. A rollout without a clock (another engine's record) falls back to
equal slices of the window it was written with: the order is real there, the durations are not.

    .venv/bin/pytest tests/test_traces.py -q
"""

from __future__ import annotations

import json
import secrets

from mlflow.entities import Span, TraceInfo, TraceLocation, TraceState
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import SpanAttributeKey, TraceMetadataKey, TraceTagKey

from rcgrpo.tracking.episodes import Message, Turn, check_fields, clip, episode_tree


def _b64(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode()


class _Builder:
    """The spans of one trace, as MLflow span dicts (v3 schema), built in order."""

    def __init__(self, trace_id: str, raw_id: bytes, max_chars: int):
        self.trace_id, self.raw_id, self.max_chars = trace_id, raw_id, max_chars
        self.spans: list[dict] = []

    def text(self, value):
        """Strings cut to max_chars, inside dicts and lists too (JSON-ready)."""
        if isinstance(value, str):
            return clip(value, self.max_chars)
        if isinstance(value, dict):
            return {k: self.text(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.text(v) for v in value]
        return value

    def span(
        self,
        name,
        kind,
        parent,
        window,
        inputs=None,
        outputs=None,
        attributes=None,
        error=False,
        message="",
    ) -> bytes:
        span_id = secrets.token_bytes(8)
        attrs = {
            SpanAttributeKey.REQUEST_ID: self.trace_id,
            SpanAttributeKey.SPAN_TYPE: kind,
            SpanAttributeKey.INPUTS: self.text(inputs),
            SpanAttributeKey.OUTPUTS: self.text(outputs),
            **(attributes or {}),
        }
        self.spans.append(
            {
                "trace_id": _b64(self.raw_id),
                "span_id": _b64(span_id),
                "parent_span_id": _b64(parent) if parent else None,
                "name": name,
                "start_time_unix_nano": int(window[0]),
                "end_time_unix_nano": int(window[1]),
                "events": [],
                "status": {
                    "code": "STATUS_CODE_ERROR" if error else "STATUS_CODE_OK",
                    "message": message[:1000],
                },
                "attributes": {k: json.dumps(v, default=str) for k, v in attrs.items()},
            }
        )
        return span_id


def _slices(window: tuple[int, int], n: int) -> list[tuple[int, int]]:
    """`window` cut into n equal consecutive slices (at least 1 ns each)."""
    start, end = window
    width = max(n, end - start)
    return [(start + width * i // n, start + width * (i + 1) // n) for i in range(max(n, 1))]


def _message_spans(b: _Builder, parent: bytes, message: Message, window) -> None:
    """The LLM span of `message`, then a TOOL span per call, children of `parent` (the turn).
    window: the message's slice when it carries no measured times."""
    usage = {
        "input_tokens": message.context_tokens,
        "output_tokens": message.tokens,
        "total_tokens": message.context_tokens + message.tokens,
    }
    attributes = {
        "tokens": message.tokens,
        "logprob_sum": message.logprob_sum,
        "context_tokens": message.context_tokens,
        SpanAttributeKey.CHAT_USAGE: usage,
    }
    outputs = {"content": message.text, "tool_calls": [c.call for c in message.calls]}
    if message.parse_errors:
        outputs["parse_errors"] = message.parse_errors
    parts = _slices(window, len(message.calls) + 1)  # generation first, then each call
    b.span(
        f"message {message.index}",
        "LLM",
        parent,
        message.window or parts[0],
        {"messages": message.inputs},
        outputs,
        attributes,
        error=bool(message.parse_errors),
    )
    for call, part in zip(message.calls, parts[1:], strict=True):
        shown = call.observation is not None
        b.span(
            call.name,
            "TOOL",
            parent,
            call.window or part,
            {"call": call.call},
            {"observation": call.observation if shown else None},
            {"error": call.error, "shown_to_model": shown},
            error=call.error,
        )


def _turn_window(turn: Turn, opening, windows) -> tuple[int, int]:
    """From the turn's first ask to its last message or call end (measured), else its slices."""
    timed = [w for m in turn.messages for w in (m.window, *(c.window for c in m.calls)) if w]
    if turn.messages and turn.messages[0].window:
        return turn.messages[0].window[0], max(w[1] for w in timed)
    return opening[0], windows[-1][1]


def build_trace(
    experiment_id: str,
    run_id: str,
    rollout,
    name: str,
    attributes: dict,
    tags: dict,
    window: tuple[int, int],
    max_chars: int = 4000,
) -> tuple[TraceInfo, list[Span]]:
    """One episode as (TraceInfo, spans): see the module docstring. `name` names the trace
    (its root span), `attributes` go on the root span (any JSON value), `tags` on the trace
    (strings: searchable); window: (start, end) in ns since the epoch."""
    raw = secrets.token_bytes(16)
    trace_id = "tr-" + raw.hex()
    b = _Builder(trace_id, raw, max_chars)
    turns: list[Turn] = episode_tree(rollout)
    record = rollout.trajectory
    values, reasons = check_fields(record)
    prompt = turns[0].user if turns else ""
    inputs = {"task_id": record.task_id, "reward_goal": record.reward_token, "prompt": prompt}
    outputs = {
        **values,
        **{k: v for k, v in reasons.items() if k != "failing_turn"},
        "stop": (record.reward_reason or {}).get("stop", rollout.stop_reason),
        "calls": record.calls,
    }
    failed = not record.reward  # the trace state shows it: failures stand out in the list
    timing = getattr(rollout, "timing", None) or {}
    if timing.get("end") and all(m.window for t in turns for m in t.messages):
        window = (timing["start"], timing["end"])  # the episode's own measured wall time
    root = b.span(
        name,
        "AGENT",
        None,
        window,
        inputs,
        outputs,
        attributes,
        failed,
        outputs["reason"] if failed else "",
    )
    n_messages = sum(len(t.messages) for t in turns)
    parts = iter(_slices(window, n_messages + len(turns)))
    for turn in turns:
        opening = next(parts)  # the turn's user message
        windows = [next(parts) for _ in turn.messages] or [opening]
        span = b.span(
            f"turn {turn.index}",
            "CHAIN",
            root,
            _turn_window(turn, opening, windows),
            {"user": turn.user},
            {"messages": len(turn.messages)},
        )
        for message, part in zip(turn.messages, windows, strict=False):
            _message_spans(b, span, message, part)
    metadata = {
        TraceMetadataKey.SOURCE_RUN: run_id,
        "mlflow.trace_schema.version": "3",
        TraceMetadataKey.INPUTS: json.dumps(b.text(inputs))[:8000],
        TraceMetadataKey.OUTPUTS: json.dumps(b.text(outputs), default=str)[:8000],
    }
    info = TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=window[0] // 1_000_000,
        execution_duration=(window[1] - window[0]) // 1_000_000,
        state=TraceState.ERROR if failed else TraceState.OK,
        request_preview=clip(prompt, 1000),
        response_preview=f"reward {record.reward}: {outputs['reason'] or 'passed'}"[:1000],
        trace_metadata=metadata,
        tags={
            TraceTagKey.TRACE_NAME: name,
            "mlflow.trace.spansLocation": "TRACKING_STORE",
            **{k: str(v)[:250] for k, v in tags.items()},
        },
    )
    return info, [Span.from_dict(s) for s in b.spans]


def write_traces(
    experiment_id: str, run_id: str, episodes: list[tuple], max_chars: int = 4000
) -> list[str]:
    """Store one trace per (rollout, name, attributes, tags, (start_ns, end_ns)); returns the
    trace ids. One `start_trace` per trace, then every span of the batch in one `log_spans`."""
    client = TracingClient()
    built = [build_trace(experiment_id, run_id, *episode, max_chars) for episode in episodes]
    for info, _ in built:
        client.start_trace(info)  # first: log_spans then finds the trace with its tags
    spans = [s for _, group in built for s in group]
    if spans:
        client.log_spans(experiment_id, spans)
    return [info.trace_id for info, _ in built]
