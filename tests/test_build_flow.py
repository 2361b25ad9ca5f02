"""The Prefect build flow end to end, in a throw-away git + DVC project, under one real Prefect
test server: a run gives a validated, versioned, balanced dataset (base-policy rollouts of the
policy's own profile tried, screened by failures.refusal and counted in the manifest; the tiny
random policy's prose is refused, perturbations fill the low half); a failing suite stops before versioning and leaves the previous version
checked out; two builds at once serialize on the lock without corrupting data/.

    .venv/bin/pytest tests/test_build_flow.py -q
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rcgrpo.chat.record import HIGH, LOW, read_jsonl
from rcgrpo.config import read_params
from rcgrpo.data.dataset import DatasetConfig
from rcgrpo.data.failures import is_usable_failure
from rcgrpo.data.validation import ValidationFailed
from rcgrpo.data.versioning import data_version, file_md5s, listing, versions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `flows` lives at the repo root
from test_versioning import git, make_project  # noqa: E402  (pytest puts tests/ on sys.path)

from flows.build_dataset import build_dataset_flow, publish_dataset_flow  # noqa: E402


def config(root, **kw) -> DatasetConfig:
    return DatasetConfig(root=str(root), train_tasks=8, test_tasks=4, **{"rollouts": "off", **kw})


@pytest.fixture(scope="module")
def v1(prefect_server, tmp_path_factory):
    """A project with one version built by the flow, base-policy rollouts switched on."""
    root = make_project(tmp_path_factory.mktemp("flow") / "proj")
    budget = {"max_new_tokens": 64}  # the `rollout:` section's; episode budget: the profile's
    result = build_dataset_flow(config(root, rollouts="on"), rollout_overrides=budget)
    return root, result


def _snapshot(root):
    return (
        git(root, "rev-parse", "HEAD"),
        (root / "data.dvc").read_text(),
        file_md5s(root / "data"),
    )


def test_flow_builds_a_validated_versioned_balanced_dataset(v1):
    root, result = v1
    assert result["rev"] == git(root, "rev-parse", "HEAD")
    assert result["md5"] == data_version(root)["md5"] and not data_version(root)["dirty"]
    train = read_jsonl(root / "data" / "rctp" / "train.jsonl")
    assert Counter(r.reward_token for r in train) == {HIGH: 8, LOW: 8}
    generators = Counter(r.provenance.generator for r in train)
    assert generators["expert"] == 8 and generators["rollout"] <= 4  # rollout_share 0.5
    assert any(g.startswith("perturbation:") for g in generators)
    assert all(is_usable_failure(r) for r in train if r.reward == 0)
    assert Counter(r.reward for r in read_jsonl(root / "data/rctp/test.jsonl")) == {
        1: 4,
        0: 4,
    }
    assert all(r.reward_token is None for r in read_jsonl(root / "data/sft/train.jsonl"))
    assert (root / "reports" / "data_docs" / "index.html").exists()
    manifest = json.loads((root / "data" / "manifest.json").read_text())
    assert manifest["expert_failures"] == [] and manifest["config"]["seed"] == 0
    # rollout_profile "" resolves to the policy's own profile (params.yaml model.profile)
    assert manifest["config"]["rollout_profile"] == read_params()["model"]["profile"]
    rollouts = manifest["rollouts"]
    assert rollouts == result["rollouts"] and rollouts["tried"] == 6  # 4 train + 2 test tasks
    assert rollouts["tried"] == rollouts["kept"] + sum(rollouts["refused"].values())
    assert generators["rollout"] <= rollouts["kept"]
    assert rollouts["settings"]["engine"] == "hf" and rollouts["settings"]["max_new_tokens"] == 64
    low = manifest["low_half"]["train"]  # the policy's own failures vs perturbations
    assert low["policy_rollouts"] == generators["rollout"]
    assert low["policy_rollouts"] + low["perturbations"] == 8
    (listed,) = versions(root)
    assert listed["rows"]["rctp/train.jsonl"] == {"high": 8, "low": 8}
    assert not list((root / ".dvc" / "tmp").glob("rcgrpo-staging-*"))  # nothing left half-done


def test_a_prompt_over_the_budget_fails_the_build_even_under_auto(v1):
    """rollouts=auto skips only an engine that cannot load; a first prompt over the episode
    budget fails the build naming the budget (before: swallowed, perturbations only)."""
    from rcgrpo.data.failures import RolloutBudgetError

    root, _ = v1
    before = _snapshot(root)
    with pytest.raises(RolloutBudgetError, match=r"do not fit rollout.max_total_tokens = 600"):
        build_dataset_flow(
            config(root, rollouts="auto"), rollout_overrides={"max_total_tokens": 600}
        )
    assert _snapshot(root) == before


def test_failing_suite_stops_before_versioning_and_keeps_the_previous_version(v1):
    root, _ = v1
    before = _snapshot(root)
    # No perturbation kinds and no rollouts: no failures, so the balance expectation fails.
    with pytest.raises(ValidationFailed, match="is_high.*high/low balance") as err:
        build_dataset_flow(config(root, kinds=(), seed=3))
    assert "rctp/train.jsonl" in str(err.value)
    assert _snapshot(root) == before
    assert not git(root, "status", "--porcelain", "data.dvc")


def test_bad_data_is_refused_with_its_rows_and_the_previous_version_stays(v1, tmp_path):
    root, _ = v1
    before = _snapshot(root)
    bad = tmp_path / "bad"
    shutil.copytree(root / "data", bad)
    path = bad / "rctp" / "train.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValidationFailed, match=r"line 2 .*not valid JSON"):
        publish_dataset_flow(str(bad), config(root))
    assert _snapshot(root) == before
    assert listing(root, data_version(root)["md5"]) == file_md5s(root / "data")
    assert path.read_text().splitlines()[1] == "{not json"  # the user's folder is left as it was


def test_two_builds_at_once_serialize_without_corruption(v1):
    root, _ = v1
    n_before = len(versions(root))
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(build_dataset_flow, config(root, seed=s)) for s in (11, 12)]
        results = [r.result(timeout=300) for r in runs]
    assert {r["md5"] for r in results} == {r["md5"] for r in results if r["changed"]}
    assert len(versions(root)) == n_before + 2  # two complete versions, one after the other
    current = data_version(root)
    assert current["md5"] in {r["md5"] for r in results} and not current["dirty"]
    assert listing(root, current["md5"]) == file_md5s(root / "data")  # data/ is one whole version
    assert subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD"]).returncode == 0
