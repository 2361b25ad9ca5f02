"""`rcgrpo env run/show` from outside, as a user debugging a task would call them."""

import json
import os
import subprocess
import sys

RCGRPO = [sys.executable, "-m", "rcgrpo.cli"]


def run(*args):
    env = {**os.environ, "COLUMNS": "400"}  # rich wraps error panels to the terminal width
    return subprocess.run([*RCGRPO, *args], capture_output=True, text=True, timeout=120, env=env)


def test_env_run_prints_observations_and_both_verdicts(tmp_path):
    calls = tmp_path / "calls.json"
    calls.write_text(
        json.dumps(
            [
                ["ls(a=True)"],
                ["cd(folder='workspace')", "mv(source='log.txt',destination='archive')"],
                ["cd(folder='archive')", "grep(file_name='log.txt',pattern='Error')"],
                ['{"name": "tail", "arguments": {"file_name": "log.txt", "lines": 20}}'],
            ]
        )
    )
    result = run("env", "run", "multi_turn_base_1", "--calls", str(calls))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["paper_reward"]["passed"] and out["bfcl_check"]["passed"]
    assert len(out["turns"]) == 4
    assert "current_directory_content" in out["turns"][0]["steps"][0]["observations"][0]


def test_env_run_hostile_call_is_an_observation_not_a_crash(tmp_path):
    calls = tmp_path / "calls.json"
    canary = tmp_path / "pwned"
    calls.write_text(json.dumps([[f"__import__('os').system('touch {canary}')"], [], [], []]))
    result = run("env", "run", "multi_turn_base_1", "--calls", str(calls))
    assert result.returncode == 0 and not canary.exists()
    out = json.loads(result.stdout)
    assert out["turns"][0]["steps"][0]["observations"][0].startswith("Error")
    assert not out["bfcl_check"]["passed"]


def test_env_errors_say_what_and_where(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[["ls()"]')
    result = run("env", "run", "multi_turn_base_1", "--calls", str(bad))
    assert result.returncode != 0 and "not valid JSON" in result.stderr
    result = run("env", "run", "multi_turn_base_1", "--calls", str(tmp_path / "none.json"))
    assert result.returncode != 0 and "does not exist" in result.stderr
    bad.write_text("[[" + "9" * 5000 + "]]")  # a traceback before
    result = run("env", "run", "multi_turn_base_1", "--calls", str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "Invalid value for --calls" in result.stderr and "4300 digits" in result.stderr
    result = run("env", "show", "multi_turn_base_1000")
    assert result.returncode != 0 and "unknown task id" in result.stderr


def test_env_show_prints_the_task():
    result = run("env", "show", "multi_turn_miss_func_0")
    assert result.returncode == 0
    task = json.loads(result.stdout)
    assert task["missed_functions"] == {"3": ["sort"]} and task["split"] in ("train", "test")


def test_env_run_scores_only_the_calls_that_ran(tmp_path):
    """miss_func_7 reveals `mkdir` at turn 1. Called at turn 0 it is refused live (an error
    observation, no folder made), yet `env run` scored it as run: the paper reward passed an
    episode whose state never had the folder. It scores what ran, as the agent loop records."""
    calls = tmp_path / "calls.json"
    calls.write_text(
        json.dumps(
            [
                ["cd(folder='academic_venture')", "mkdir(dir_name='academic_hub')"],
                [],
                ["find(path='.',name='goal')"],
                ["cat(file_name='goals.txt')"],
            ]
        )
    )
    result = run("env", "run", "multi_turn_miss_func_7", "--calls", str(calls))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    refused = out["turns"][0]["steps"][1]["observations"][0]
    assert refused == "Error during execution: function 'mkdir' is not available"
    assert not out["paper_reward"]["passed"] and "R_state = 0" in out["paper_reward"]["reason"]
