"""BFCL v4's agentic memory category as bfcl-eval ships it (questions, answers and their source,
the scenarios' conversations, the key-value tool docs), and the calls an expert makes in it.
rcgrpo.envs.memory is the environment around them.

    .venv/bin/pytest tests/test_memory_env.py -q
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from rcgrpo.bfcl.tasks import bfcl_data_dir

CATEGORIES = ("customer", "finance", "healthcare", "notetaker", "student")  # the scenarios


@dataclass(frozen=True)
class MemoryTask:
    id: str  # bfcl-eval's entry id, "memory_3-customer-3"
    category: str  # the scenario
    question: str
    answers: tuple[str, ...]  # any one of them in the final reply is correct
    source: str  # the words of the conversation the answer comes from (bfcl-eval's "source")
    split: str

    @property
    def ground_truth(self) -> tuple:
        """The expert's calls per turn (rcgrpo.data's train_max_calls counts them)."""
        return tuple([list(c)] if c else [] for c in expert_calls(self))


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.cache
def all_tasks() -> dict[str, MemoryTask]:
    data = bfcl_data_dir()
    answers = {r["id"]: r for r in _rows(data / "possible_answer" / "BFCL_v4_memory.json")}
    out = {}
    for n, row in enumerate(_rows(data / "BFCL_v4_memory.json")):
        answer = answers[row["id"]]
        question = " ".join(m["content"] for turn in row["question"] for m in turn)
        source = answer.get("source", "").strip(". ")
        split = "test" if n % 10 == 0 else "train"
        out[row["id"]] = MemoryTask(
            row["id"], row["scenario"], question, tuple(answer["ground_truth"]), source, split
        )
    return out


@functools.cache
def conversation(scenario: str) -> tuple:
    """The scenario's prerequisite conversation, every entry's turns in order."""
    path = bfcl_data_dir() / "memory_prereq_conversation" / f"memory_{scenario}.json"
    return tuple(turn for entry in _rows(path) for turn in entry["question"])


@functools.cache
def tool_docs() -> tuple[dict, ...]:
    path = bfcl_data_dir() / "multi_turn_func_doc" / "memory_kv.json"
    return tuple(_rows(path))


def plain(text: str) -> str:
    """Text compared loosely: lower case, straight quotes, no surrounding quotes or spaces."""
    text = text.replace("\u2019", "'").replace("\u201c", '"').replace("\u201d", '"')
    return text.lower().strip(" \"'")


def expert_calls(task: MemoryTask) -> list[list[str]]:
    """Per turn, the calls an expert makes: it stores the turn the answer comes from, and at
    the question reads it back; no call elsewhere."""
    key = "fact_for_question"
    calls = []
    for turn in conversation(task.category):
        text = " ".join(m["content"] for m in turn)
        fact = text[:2000]  # MAX_ARCHIVAL_MEMORY_ENTRY_LENGTH
        holds = any(plain(f)[:60] in plain(text) for f in task.source.split("...") if len(f) > 15)
        calls.append([f"archival_memory_add(key={key!r}, value={fact!r})"] if holds else [])
    calls.append([f"archival_memory_retrieve(key={key!r})"])
    return calls
