"""Each setting is declared once (rule + help in its dataclass); `rcgrpo config show` prints it and
params.yaml's field comments are written from it.

    .venv/bin/pytest tests/test_config_show.py -q
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from rcgrpo.cli.config import table, with_comments
from rcgrpo.config import SECTIONS, ConfigError, build, params_path, parse_sets, section_class


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "rcgrpo.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_every_field_of_every_section_has_a_help_string():
    missing = [
        f"{section}.{f.name}"
        for section in SECTIONS
        for f in dataclasses.fields(section_class(section))
        if not f.metadata.get("help", "").strip()
    ]
    assert not missing, f"fields without setting(default, help) or ranged(..., help): {missing}"


def test_params_yaml_field_comments_are_the_help():
    """The comments are generated: after a help changes, `rcgrpo config comments` rewrites them."""
    text = params_path().read_text()
    stale = [
        f"-{a}\n+{b}"
        for a, b in zip(text.split("\n"), with_comments(text).split("\n"), strict=True)
        if a != b
    ]
    assert not stale, "run `rcgrpo config comments`:\n" + "\n".join(stale)


def test_every_field_the_paper_preset_sets_names_the_papers_value():
    """params.yaml's sections are the CPU default; where the paper preset changes a field, the
    field's comment (its line, or the comment lines just above it) or, for a field the sections
    leave out, its help, names the paper's value."""
    from rcgrpo.config import read_params
    from rcgrpo.fields import help_of

    lines = params_path().read_text().split("\n")
    paper = read_params()["presets"]["paper"]
    missing = []
    for section, fields in paper.items():
        start = lines.index(next(ln for ln in lines if ln.startswith(f"{section}:")))
        for name in fields:
            at = next(
                (i for i in range(start + 1, len(lines)) if lines[i].startswith(f"  {name}:")), None
            )
            if at is None:  # the section leaves it at its default: the help says it
                helps = {f.name: help_of(f) for f in dataclasses.fields(section_class(section))}
                said = helps[name]
            else:
                above = at
                while lines[above - 1].startswith("  #"):
                    above -= 1
                said = " ".join(lines[above : at + 1]).partition(f"  {name}:")[0] + lines[at]
            if "paper" not in said:
                missing.append(f"{section}.{name}")
    assert not missing, f"no comment names the paper's value: {missing}"


def test_comments_rewrite_stale_and_missing_ones_and_keep_everything_else():
    text = (
        "seed: 0  # top-level, not a section\n"
        "# why the RL section looks like this\n"
        "rl:  # an old class path\n"
        "  # 256 prompts x G: the paper's batch\n"
        "  tasks_per_step: 256  # an old, wrong help\n"
        '  init_path: "a#b"\n'
        "presets:\n"
        "  cpu:\n"
        "    rl: {steps: 2}  # a preset line\n"
    )
    lines = with_comments(text).split("\n")
    assert lines[:2] == text.split("\n")[:2]
    assert lines[2] == "rl:  # rcgrpo.training.grpo.config.RLConfig"
    assert lines[3] == "  # 256 prompts x G: the paper's batch"
    assert lines[4] == (
        "  tasks_per_step: 256  # groups per step; the batch is tasks_per_step * group_size rollouts"
    )
    assert lines[5] == '  init_path: "a#b"  # the model to start from; "" = outputs/<init>/final'
    assert lines[6:] == text.split("\n")[6:]
    assert with_comments("\n".join(lines)) == "\n".join(lines)  # a second run changes nothing


def test_config_show_rl_prints_value_default_rule_and_help_of_every_field():
    out = cli("config", "show", "rl", "--set", "rl.p_high=0.25")
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert text.startswith("rl:  rcgrpo.training.grpo.config.RLConfig")
    for f in dataclasses.fields(section_class("rl")):
        assert f"\n  {f.name} " in text and f.metadata["help"][:40] in text, f.name
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("  ")}
    assert rows["p_high"][:5] == ["p_high", "0.25", "*", "0.5", "[0,"]  # --set, default, range
    assert rows["steps"][:4] == ["steps", "20", "*", "400"]  # params.yaml: the CPU default
    assert rows["advantage"][1:] == [
        "grpo",
        "grpo",
        "grpo",
        "|",
        "mean",
        "|",
        "sign",
        "|",
        "max_norm",
    ]
    everything = cli("config", "show")
    assert everything.returncode == 0 and all(
        f"\n{s}:  " in f"\n{everything.stdout}" for s in SECTIONS
    )


def test_config_show_resolves_a_variant_as_rcgrpo_run_does():
    """`--variant rctp+grpo`: the variant's RL fields (goal always high) on top of params.yaml,
    as `rcgrpo run --variant rctp+grpo` trains; the last line names the layers shown."""
    out = cli("config", "show", "rl", "--variant", "rctp+grpo")
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {ln.split()[0]: ln.split() for ln in out.stdout.splitlines() if ln.startswith("  ")}
    assert rows["p_high"][:3] == ["p_high", "1.0", "*"] and rows["steps"][1] == "20"
    assert out.stdout.strip().splitlines()[-1].startswith("(params.yaml + variant rctp+grpo:")


def test_config_show_refuses_a_bad_value_in_the_usual_one_line():
    out = cli("config", "show", "rl", "--set", "rl.p_high=7.0")
    assert out.returncode == 2 and out.stderr.strip() == "error: rl.p_high=7.0: must be in [0, 1]"
    out = cli("config", "show", "nosuch")
    assert (
        out.returncode == 2 and "no such section" in out.stderr and "\n" not in out.stderr.strip()
    )


def test_a_choice_is_a_literal_and_its_error_names_the_choices():
    for pair, says in [
        ("rollout.engine=x", "rollout.engine=x: must be one of hf, vllm"),
        ("rollout.scheduler=x", "rollout.scheduler=x: must be one of async, lockstep"),
        ("model.profile=x", "model.profile=x: must be one of tiny, qwen-shape, smollm2-135m"),
    ]:
        with pytest.raises(ConfigError, match="^" + says.replace(".", r"\.")):
            parse_sets([pair], sectioned=True)


def test_the_rule_no_declaration_carries_still_holds():
    """eval.tokens=[] fits its type (a list of goals) but names none: __post_init__ refuses it."""
    with pytest.raises(ConfigError, match=r"^eval: eval.tokens must name at least one"):
        build(section_class("eval"), {"tokens": []}, "eval")


def test_table_wraps_help_under_its_field():
    cfg = section_class("env")()
    text = table("env", cfg, width=40)
    lines = text.splitlines()
    assert lines[5].split() == ["tool_timeout_s", "5.0", "5.0", "(0,", "inf)"]
    assert all(len(line) <= 40 for line in lines[3:5] + lines[6:9])


def test_a_declaration_holds_when_a_config_is_made_in_code_too():
    """@config_class checks every field as build does, so no __post_init__ repeats a rule."""
    from rcgrpo.training.grpo.config import RLConfig

    with pytest.raises(ValueError, match=r"^RLConfig.p_high=7.0: must be in \[0, 1\]$"):
        RLConfig(p_high=7.0)
    with pytest.raises(ValueError, match=r"^RLConfig.steps=0: must be in \[1, inf\)$"):
        RLConfig(steps=0)
    for section in SECTIONS:  # every default fits its own declaration
        section_class(section)()
