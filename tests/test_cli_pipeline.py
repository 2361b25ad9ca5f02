"""The CLI surface: `rcgrpo --help` stays fast and light; `--set` parsing."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from rcgrpo.cli.pipeline import _overrides

HEAVY = ("torch", "mlflow", "prefect", "dvc", "great_expectations", "transformers", "peft")


def test_help_is_fast_and_imports_no_heavy_library():
    code = (
        "import sys, time; t = time.perf_counter(); sys.argv = ['rcgrpo', '--help']\n"
        "from rcgrpo.cli import app\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    cpu = cpu_seconds(before)  # not wall time: that measures the box's load (2.1 s at load 25)
    assert out.returncode == 0, out.stderr
    for command in ("run", "ui", "schedule", "stage", "compare", "env"):
        assert f" {command} " in out.stdout
    assert "HEAVY []" in out.stdout
    assert cpu < 1.5, f"rcgrpo --help took {cpu:.2f} s of CPU"


def cpu_seconds(before: resource.struct_rusage) -> float:
    """CPU seconds (user + system) of the children this process waited for since `before`."""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def test_set_overrides_are_sectioned_yaml_values():
    got = _overrides(["rl.steps=2", "eval.tokens=[high, low]", "model.profile=tiny"])
    assert got == {"rl": {"steps": 2}, "eval": {"tokens": ["high", "low"]},
                   "model": {"profile": "tiny"}}  # fmt: skip


@pytest.mark.parametrize("bad", ["steps=2", "rl.steps", ".x=1"])
def test_set_without_section_or_value_is_refused(bad):
    from rcgrpo.config import ConfigError

    with pytest.raises(ConfigError, match="section.key=value"):
        _overrides([bad])


@pytest.mark.parametrize(
    "args, says",
    [
        (["run", "--set", "rl.steps=abc"], "error: rl.steps=abc: must be an int"),
        (["run", "--set", "nosuch.key=1"], "unknown section 'nosuch'; valid: ["),
        (["run", "--set", "eavl.limit=1"], "unknown section 'eavl' (did you mean 'eval'?)"),
        (["run", "--set", "eval.limt=1"], "eval has no key 'limt' (did you mean 'limit'?)"),
        (["schedule", "--set", "rl.stepz=1"], "rl has no key 'stepz' (did you mean 'steps'?)"),
        (["stage", "rl", "--set", "steps=abc"], "error: rl.steps=abc: must be an int"),
        (["stage", "rctp", "--set", "epohcs=1"], "did you mean 'epochs'?"),
        (
            ["stage", "eval", "--model", "outputs/nothing/here"],
            "outputs/nothing/here is not a folder",
        ),
        (["data", "build", "--set", "data_dirr=x"], "did you mean 'data_dir'?"),
    ],
)
def test_a_bad_set_fails_at_once_in_one_line_naming_it(args, says):
    """Before any Prefect server, MLflow run or training: exit 2, `error: ...`, no traceback."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "rcgrpo.cli", *args], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith("error: ") and says in out.stderr, out.stderr
    assert cpu_seconds(before) < 60  # was 28 s + a traceback for rl.steps=abc


def test_a_typo_in_an_override_fails_before_any_run_is_opened():
    from rcgrpo.config import ConfigError
    from rcgrpo.run_config import resolve

    resolve(None, "", "rctp+rc-grpo", {"rl": {"steps": 2}, "eval": {"limit": 1}})
    with pytest.raises(ConfigError, match="bogus"):
        resolve(None, "", "", {"rl": {"bogus": 1}})
    with pytest.raises(ConfigError, match=r"rl: .*\(--set rl.micro_batch_size=7\)$"):
        resolve(None, "", "", {"rl": {"micro_batch_size": 7}})  # a rule over several fields


def _plan(**kw):
    """The RunConfig `rcgrpo run` resolves (params.yaml `pipeline:` defaults, as the CLI fills)."""
    from rcgrpo.cli.pipeline import _resolve

    args = {"sets": [], "stages": "", "variant": "", "preset": "", "profile": "", "procs": 1}
    rc = _resolve(**{**args, **kw})
    return rc, {s: getattr(rc, s) for s in ("rctp", "sft", "rl")}


def test_paper_preset_is_the_papers_hyperparameters():
    # ../shared/paper-notes.md, "Hyperparameters reported"
    plan, cfg = _plan(preset="paper")
    rctp, sft, rl = cfg["rctp"], cfg["sft"], cfg["rl"]
    assert (rctp.mode, rctp.lr, rctp.batch_size, rctp.epochs) == ("rctp", 1e-5, 16, 5)
    assert (sft.mode, sft.lr, sft.batch_size, sft.epochs) == ("sft", 1e-5, 16, 2)
    assert (rl.lr, rl.group_size, rl.kl_coef, rl.clip_eps, rl.p_high, rl.steps) == (
        1e-6, 5, 0.1, 0.2, 0.5, 400,
    )  # fmt: skip
    assert rl.tasks_per_step == 256 and rl.mini_batch_size == 320  # 4 PPO updates per step
    assert plan.plan.preset == "paper" and plan.to_dict()["rl"]["lr"] == 1e-6


def test_the_sections_are_the_default_and_a_bad_preset_names_the_known_ones():
    plan, cfg = _plan()
    assert plan.plan.preset == "" and cfg["rl"].lr > 1e-6  # a 1M model needs a larger step
    assert plan.dataset.train_max_calls == 3
    with pytest.raises(ValueError, match=r"'gpu' is not in params.yaml presets: \['paper'\]"):
        _plan(preset="gpu")


@pytest.mark.parametrize(
    "variant, init, conditioning, p_high, tokens",
    [
        ("sft+grpo", "sft", "none", 0.5, ["none"]),
        ("sft+rc-grpo", "sft", "rc", 0.5, ["none", "high", "low"]),
        ("rctp+grpo", "rctp", "rc", 1.0, ["high", "low"]),  # always <|high_reward|>
        ("rctp+rc-grpo", "rctp", "rc", 0.5, ["high", "low"]),
    ],
)
def test_variants_are_the_papers_baselines(variant, init, conditioning, p_high, tokens):
    plan, cfg = _plan(variant=variant)
    rl = cfg["rl"]
    assert (rl.init, rl.conditioning, rl.p_high) == (init, conditioning, p_high)
    assert list(plan.eval.tokens) == tokens and plan.plan.variant == variant
