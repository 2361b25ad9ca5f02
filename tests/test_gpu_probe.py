"""The GPU day-one command's CPU smoke run (`scripts/gpu_day_one.sh --smoke --out DIR`), as a
reader runs it, and `rcgrpo plan --calibration` on the file it writes: the probe's cases run
(padded rows and the shared-prefix path), their FLOPs are plan/flops.py's count, the chunked LM
head gives the plain full-logits path's log-probs and gradients, without a GPU no memory figure
is claimed, and the plan uses what was measured in place of what it assumed.

Why in `make test`: the command runs rarely, on a lent GPU with minutes of budget, so a broken
probe must show here first, not there.

    .venv/bin/pytest tests/test_gpu_probe.py -q
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def day_one(tmp_path_factory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp("day-one")
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    run = subprocess.run(
        [str(ROOT / "scripts" / "gpu_day_one.sh"), "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return run.stdout, out / "calibration.json"


def _case(text: str, name: str):
    line = next(s for s in text.splitlines() if s.startswith(name + ":"))
    rows, width, tokens, sampled = re.search(
        r"(\d+) rows x ([\d,]+) = ([\d,]+) computed tokens, ([\d,]+) sampled", line
    ).groups()
    return int(rows), int(width.replace(",", "")), int(tokens.replace(",", "")), int(sampled)


def test_chunked_head_matches_the_plain_full_logits_path(day_one):
    text, _ = day_one
    line = next(s for s in text.splitlines() if s.startswith("reference forward"))
    dlogp, dgrad, scale = (
        float(x)
        for x in re.search(
            r"max \|d log-prob\| (\S+), max \|d grad\| / max \|grad\| (\S+) \(max \|grad\| (\S+)\)",
            line,
        ).groups()
    )
    assert scale > 0, line  # a real update: the gradients compared are not all zero
    assert dlogp <= 1e-5 and dgrad <= 1e-5, line


def test_typical_rows_are_the_trainers_micro_batches_of_replayed_episodes(day_one):
    from rcgrpo.training.plan.timing import episode_shapes

    text, _ = day_one
    lengths = {sum(math.ceil(p / 16) + math.ceil(s / 16) for p, s in e)
               for e in episode_shapes().values()}  # fmt: skip
    rows, width, tokens, sampled = _case(text, "typical rows")
    assert width in lengths and tokens == rows * width  # padded rows: B x the longest
    assert 0 < sampled < tokens
    # the default path: the same rollouts with shared prompt prefixes, computed once
    rows, width, tokens, sampled = _case(text, "typical rows, shared prefixes")
    assert rows >= 2 and width in lengths and tokens < rows * width, (rows, width, tokens)


def test_flops_are_what_ran_counted_by_the_plans_formula(day_one):
    """Each case's FLOPs are plan/flops.py's for its tokens, attended pairs and head positions:
    pi_old and the reference forwards, the pass's forward, the checkpoint recompute and the
    backward; above the 6 x decoder weights per token the probe once counted."""
    from rcgrpo.training.plan.flops import Work, linear_params, step_flops
    from rcgrpo.training.plan.timing import PREFIX_TAIL

    _, path = day_one
    data = json.loads(path.read_text())
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_update_probe
    from probe_cases import probe_arch

    arch = probe_arch(gpu_update_probe.config(gpu_update_probe.parse(["--smoke"])))
    lora = arch.lora_params(16, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                 "down_proj"))  # fmt: skip
    assert {c["name"] for c in data["cases"]} == {
        "worst case: one episode",
        "typical rows",
        "typical rows, shared prefixes",
    }
    for case in data["cases"]:
        work = Work(case["tokens"], case["pairs"], case["sampled"])
        assert case["flops"] == pytest.approx(step_flops(arch, work, True, lora))
        assert case["flops"] >= 10 / 6 * 6 * linear_params(arch) * case["tokens"]
    padded = next(c for c in data["cases"] if c["name"] == "typical rows")
    assert padded["pairs"] == padded["rows"] * padded["width"] ** 2 / 2
    shared = next(c for c in data["cases"] if c["name"] == "typical rows, shared prefixes")
    assert shared["pairs"] < shared["rows"] * shared["width"] ** 2 / 2 and PREFIX_TAIL > 0


def test_the_calibration_file_says_what_was_measured_and_why_not(day_one):
    from rcgrpo.training.plan.calibration import FIELDS, load

    text, path = day_one
    data = json.loads(path.read_text())
    assert data["smoke"] is True and data["device"]["name"] == "cpu"
    assert data["device"]["allocator_settings"] == "expandable_segments:True"
    assert set(data["constants"]) == set(FIELDS)
    measured = {k for k, v in data["constants"].items() if v["value"] is not None}
    assert measured == {"MFU", "MFU_SHARED", "PREFILL_EFF", "BANDWIDTH_EFF"}
    for key in ("CUDA_CONTEXT_GB", "ALLOCATOR_SLACK"):  # no memory figure without a GPU
        assert data["constants"][key]["why"] == "no CUDA device"
    assert "vLLM" in data["constants"]["VLLM_OVERHEAD_GB"]["why"]
    assert "peak allocated" not in text
    assert load(path).mfu == data["constants"]["MFU"]["value"]


def plan_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rcgrpo.cli", "plan", "--profile", "qwen2.5-7b-instruct",
           "--preset", "paper", "--gpus", "8", "--gpu-memory", "80", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_plan_uses_the_calibration_in_place_of_its_assumptions(day_one, tmp_path):
    _, path = day_one
    data = json.loads(path.read_text())
    mfu = data["constants"]["MFU"]["value"]
    assumed, calibrated = plan_cli(), plan_cli("--calibration", str(path))
    assert assumed.returncode == 0 and calibrated.returncode == 0, calibrated.stderr
    text = calibrated.stdout
    assert f"calibration {path} (cpu, " in text and "measured on another device" in text
    table = text.split("\nconstants (")[1]
    row = next(s for s in table.splitlines() if "model FLOPs utilisation" in s)
    assert f"{mfu:.2f}" in row and "measured (cpu, " in row, row
    row = next(s for s in table.splitlines() if "CUDA context per process" in s)
    assert "assumed (no CUDA device)" in row, row
    # the update's time is its FLOPs at the measured MFU: the same FLOPs, time x 0.35 / mfu
    pattern = r"update: ([\d,]+) PFLOP at MFU ([\d.]+) on 8 GPUs\s+(\d+) s"
    a, c = re.search(pattern, assumed.stdout).groups(), re.search(pattern, text).groups()
    assert a[0] == c[0] and c[1] == f"{mfu:.2f}"
    assert int(c[2]) == pytest.approx(int(a[2]) * 0.35 / mfu, rel=0.01)
    # a bad file: one line naming the file and the constant, exit 2
    bad = json.loads(path.read_text())
    bad["constants"]["MFU"]["value"] = 1.7
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    out = plan_cli("--calibration", str(tmp_path / "bad.json"))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "bad.json" in lines[0] and "constants.MFU.value 1.7" in lines[0], lines
    gone = plan_cli("--calibration", str(tmp_path / "none.json"))
    assert gone.returncode == 2 and "no such file" in gone.stderr
