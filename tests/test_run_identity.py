"""`--resume` continues its own run only (rcgrpo.training.run_identity). The probe: a fresh run
into an out_dir that holds an older run's checkpoints, killed part-way, then resumed. Before, it
resumed the *older* run (0 steps trained, the old weights saved as final). Now the fresh run
moves the old checkpoints aside, a resume refuses another run's checkpoint or a changed config
in one line, and `--resume-from PATH` still loads a named one. ~10 s (a tiny Llama, 8 examples).

    .venv/bin/pytest tests/test_run_identity.py -q
"""

from __future__ import annotations

import json
import shutil

import pytest
from test_sft import examples, tiny_model

from rcgrpo.training.checkpoint import CheckpointError
from rcgrpo.training.run_identity import config_hash
from rcgrpo.training.sft import train_sft
from rcgrpo.training.sft_config import SFTConfig


def _cfg(out, **kw) -> SFTConfig:
    return SFTConfig(
        **{
            "batch_size": 4,
            "micro_batch_size": 4,
            "epochs": 2,
            "lr": 3e-2,
            "save_every": 2,
            "out_dir": str(out),
            **kw,
        }
    )


def test_config_hash_by_hand():
    assert config_hash({"a": 1, "b": [2]}) == config_hash({"b": [2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2}) and len(config_hash({})) == 16


def test_resume_takes_its_own_run_only(tmp_path):
    data, out = examples(8), tmp_path / "out"
    old = _cfg(out, epochs=3)  # the older run: 6 steps, checkpoints 2, 4, 6
    train_sft(tiny_model(), data, old)
    old_id = json.loads((out / "run.json").read_text())["run_id"]

    new = _cfg(out, lr=1e-2)  # a fresh run into the same out_dir: 4 steps
    train_sft(tiny_model(), data, new)
    aside = [p for p in out.iterdir() if p.name.startswith("checkpoints.old-")]
    assert len(aside) == 1 and (aside[0] / "step_000006" / "state.pt").is_file()  # kept
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000002", "step_000004"]
    new_id = json.loads((out / "run.json").read_text())["run_id"]
    assert new_id != old_id
    ckpt = out / "checkpoints" / "step_000004"
    assert json.loads((ckpt / "run.json").read_text()) == {
        "run_id": new_id,
        "config_hash": config_hash(new.__dict__),
    }

    # killed after step 2; the old run's step_000006 put back beside it (the probe's folder)
    shutil.rmtree(ckpt)
    shutil.copytree(aside[0] / "step_000006", out / "checkpoints" / "step_000006")
    with pytest.raises(CheckpointError) as refused:
        train_sft(tiny_model(), data, new, resume=True)
    line = str(refused.value)
    assert "\n" not in line and f"written by run {old_id}, not by {new_id}" in line
    assert "--resume-from" in line
    shutil.rmtree(out / "checkpoints" / "step_000006")

    with pytest.raises(CheckpointError, match="written with another config"):
        train_sft(tiny_model(), data, _cfg(out, lr=5e-2), resume=True)  # the settings changed

    resumed = train_sft(tiny_model(), data, new, resume=True)  # its own step 2: steps 3, 4
    assert len(resumed) == 2
    named = train_sft(tiny_model(), data, old, resume=str(aside[0] / "step_000004"))
    assert len(named) == 2  # --resume-from: the old run's step 4, steps 5 and 6
