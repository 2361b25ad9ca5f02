"""The CLI surface of issue 6: `rcgrpo --help` stays fast and light; `--set` parsing."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import typer

from rcgrpo.cli.pipeline import _overrides

HEAVY = ("torch", "mlflow", "prefect", "dvc", "great_expectations", "transformers", "peft")


def test_help_is_fast_and_imports_no_heavy_library():
    code = (
        "import sys, time; t = time.perf_counter(); sys.argv = ['rcgrpo', '--help']\n"
        "from rcgrpo.cli import app\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])"
    )
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    wall = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    for command in ("run", "ui", "schedule", "train", "eval", "compare", "env"):
        assert f" {command} " in out.stdout
    assert "HEAVY []" in out.stdout
    assert wall < 1.5, f"rcgrpo --help took {wall:.2f} s"


def test_set_overrides_are_sectioned_yaml_values():
    got = _overrides(["rl.steps=2", "eval.tokens=[high, low]", "model.profile=tiny"])
    assert got == {"rl": {"steps": 2}, "eval": {"tokens": ["high", "low"]},
                   "model": {"profile": "tiny"}}  # fmt: skip


@pytest.mark.parametrize("bad", ["steps=2", "rl.steps", ".x=1"])
def test_set_without_section_or_value_is_refused(bad):
    with pytest.raises(typer.BadParameter, match="section.key=value"):
        _overrides([bad])


def test_a_typo_in_an_override_fails_before_any_run_is_opened():
    from rcgrpo.config import ConfigError
    from rcgrpo.runtime import project_root

    if str(project_root()) not in sys.path:
        sys.path.insert(0, str(project_root()))
    from flows.pipeline import check_configs

    check_configs({"rl": {"steps": 2}, "eval": {"limit": 1}}, ["finetune", "rl", "eval"], "rctp")
    with pytest.raises(ConfigError, match="bogus"):
        check_configs({"rl": {"bogus": 1}}, ["rl"], "rctp")
