"""`rcgrpo plan` checks the longest first prompt against the rollout budget, and every GPU command
in the docs passes that check: the figures it uses are measured here with the real tokenizers.

    .venv/bin/pytest tests/test_plan_budget.py -q
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rcgrpo.cli.plan import resolve
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.training.plan import constants as C
from rcgrpo.training.plan.report import budget_problem, make_plan

ROOT = Path(__file__).resolve().parents[1]
GPU = re.compile(r"qwen2\.5-7b-instruct|llama-3\.1-8b-instruct|--procs [2-9]|engine=vllm")
# a README line that names no preset runs params.yaml's 1,536-token budget: it is refused


def gpu_commands(path: Path) -> list[str]:
    """`rcgrpo run|plan ...` lines of a markdown file's code blocks that need a GPU (commands to
    copy; `$ ...` lines are transcripts shown with their output, refusals included)."""
    text, out, inside = path.read_text(), [], False
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        cmd = line.split("#")[0].strip()
        if inside and re.match(r"rcgrpo (run|plan) ", cmd) and "..." not in cmd and GPU.search(cmd):
            out.append(" ".join(cmd.split()))
    return out


def plan_args(cmd: str) -> dict:
    """The preset, --sets, profile and GPU count a command would run with."""
    words, out = shlex.split(cmd)[2:], {"preset": "", "sets": [], "profile": "", "gpus": 1}
    for flag, value in zip(words, [*words[1:], ""], strict=True):
        if flag == "--preset":
            out["preset"] = value
        elif flag == "--set":
            out["sets"].append(value)
        elif flag == "--profile":
            out["profile"] = value
        elif flag in ("--procs", "--gpus"):
            out["gpus"] = int(value)
    return out


def planned(cmd: str):
    a = plan_args(cmd)
    cfg = resolve(a["preset"], a["sets"], a["profile"])
    gpu = C.GPUS["h100"]
    make_plan(
        cfg["model"],
        cfg["rollout"],
        cfg["rl"],
        cfg["finetune"],
        cfg["stage"],
        a["gpus"],
        gpu,
        gpu.memory_gb,
        C.SAMPLED_SHARE,
        C.MFU,
    )
    return budget_problem(cfg["model"], cfg["rollout"])


DOCS = [(p, c) for p in sorted((ROOT / "docs").glob("*.md")) for c in gpu_commands(p)]
README = gpu_commands(ROOT / "README.md")


def test_the_docs_have_gpu_commands():
    names = {p.name for p, _ in DOCS}
    assert {"gpu-setup.md", "scaling.md"} <= names, names


@pytest.mark.parametrize("cmd", [c for _, c in DOCS] + README)
def test_every_gpu_command_in_the_docs_passes_the_budget_check(cmd):
    assert planned(cmd) is None, cmd


def test_the_one_gpu_command_without_a_preset_is_refused_by_plan_not_after_the_export():
    """Without --preset params.yaml's CPU budget (1,536 tokens) applies: plan says so at once."""
    problem = planned("rcgrpo run --profile qwen2.5-7b-instruct --set rollout.engine=vllm")
    assert problem and "7,757 tokens" in problem and "= 1,536" in problem, problem


def test_plan_refuses_the_cpu_budget_for_a_7b_profile_in_one_line():
    from rcgrpo.training.plan.memory import NoFit
    from rcgrpo.training.plan.report import check

    cfg = resolve("", [], "qwen2.5-7b-instruct")  # params.yaml's CPU budget
    gpu = C.GPUS["h100"]
    plan = make_plan(
        cfg["model"],
        cfg["rollout"],
        cfg["rl"],
        cfg["finetune"],
        cfg["stage"],
        8,
        gpu,
        gpu.memory_gb,
        C.SAMPLED_SHARE,
        C.MFU,
    )
    with pytest.raises(NoFit, match=r"^rollout: the longest first prompt \(7,757 tokens"):
        check(plan)


@pytest.mark.parametrize(
    ("profile", "protocols"), [("tiny", ("combined", "bfcl")), ("qwen-shape", ("combined",))]
)
def test_first_prompt_figures_are_measured(profile, protocols):
    """FIRST_PROMPT_MAX re-measured: every task's first prompt (high goal) with the profile's
    tokenizer and tool docs (qwen-shape: the 7B profiles' tokenizer, full JSON docs)."""
    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import HIGH
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import PROFILES, ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.hf import HFEngine

    tasks = tasks_in("train") + tasks_in("test")
    assert len(tasks) == 800
    with HFEngine(RolloutConfig(), load_policy(ModelConfig(profile=profile)), BFCL) as engine:
        for protocol in protocols:
            key = (PROFILES[profile].compact_docs, protocol)
            assert max(engine.prompt_lengths(tasks, HIGH, protocol)) == C.FIRST_PROMPT_MAX[key]
