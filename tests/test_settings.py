"""Every field of every stage config is checked in one place.

A table gives each field of each config dataclass one bad value; the test refuses it through
`--set` (parse_sets) and through a params.yaml file (check_params), and asserts that the fields
covered are exactly the fields that exist, so a field added later without a table row (and, if
numeric, without a `ranged(...)` interval or a Literal) fails here. The reported cases run
through the real CLI: one line, exit 2, in seconds, before anything starts.

    .venv/bin/pytest tests/test_settings.py -q
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
import typing

import pytest
import yaml

from rcgrpo.config import SECTIONS, ConfigError, check_params, parse_sets, section_class

# section -> field -> (bad value as typed after `--set section.field=`, what the error says)
BAD = {
    "rctp": {  # SFTConfig (also `sft`)
        "mode": ("x", "must be one of sft, rctp"),
        "data": ("[a]", "must be a string"),
        "out_dir": ("[a]", "must be a string"),
        "lr": ("-1.0", "must be in (0, 1]"),
        "lr_lora": ("-1.0", "must be in [0, 1]"),
        "batch_size": ("-4", "must be in [1, inf)"),
        "micro_batch_size": ("0", "must be in [1, inf)"),
        "max_tokens_per_micro_batch": ("-1", "must be in [0, inf)"),
        "epochs": ("-1", "must be in [1, inf)"),
        "max_len": ("-1", "must be in [0, inf)"),
        "warmup_ratio": ("1.5", "must be in [0, 1)"),
        "weight_decay": ("-0.1", "must be in [0, 1]"),
        "grad_clip": ("-1", "must be in [0, inf)"),
        "save_every": ("-1", "must be in [0, inf)"),
        "seed": ("-1", "must be in [0, inf)"),
    },
    "rl": {
        "init": ("x", "must be one of sft, rctp"),
        "init_path": ("[a]", "must be a string"),
        "conditioning": ("x", "must be one of none, rc"),
        "advantage": ("x", "must be one of grpo, mean, sign, max_norm"),
        "token_sampling": ("x", "must be one of iid, stratified"),
        "p_high": ("7.0", "must be in [0, 1]"),
        "group_size": ("0", "must be in [1, inf)"),
        "tasks_per_step": ("0", "must be in [1, inf)"),
        "steps": ("-1", "must be in [1, inf)"),
        "generated_token_budget": ("-5", "must be in [0, inf)"),
        "inner_epochs": ("0", "must be in [1, inf)"),
        "mini_batch_size": ("-1", "must be in [0, inf)"),
        "micro_batch_size": ("0", "must be in [1, inf)"),
        "max_tokens_per_micro_batch": ("-1", "must be in [0, inf)"),
        "max_sampled_per_micro_batch": ("-1", "must be in [0, inf)"),
        "group_filter": ("best", "must be one of none, drop_zero_variance, top_variance"),
        "top_variance_keep": ("0", "must be in (0, 1]"),
        "refill": ("more", "must be one of none, oversample"),
        "refill_max_rounds": ("-1", "must be in [0, inf)"),
        "task_prefilter": ("greso", "must be one of none, no_signal"),
        "prefilter_keep": ("0", "must be in (0, 1]"),
        "rollouts_per_task": ("-1", "must be in [0, inf)"),
        "shared_prefix": ("maybe", "must be true or false"),
        "behaviour_logprobs": ("vllm", "must be one of recompute, engine"),
        "engine_is": ("seq", "must be one of none, token, sequence"),
        "engine_is_cap": ("0.5", "must be in [1, inf)"),
        "engine_is_bound": ("1", "must be in (0, 1)"),
        "sync_gap_max": ("-0.1", "must be in [0, inf)"),
        "lr": ("-1.0", "must be in (0, 1]"),
        "lr_lora": ("-1.0", "must be in [0, 1]"),
        "warmup_steps": ("-1", "must be in [0, inf)"),
        "grad_clip": ("-1.0", "must be in [0, inf)"),
        "clip_eps": ("-1.0", "must be in (0, 1]"),
        "kl_coef": ("-0.1", "must be in [0, inf)"),
        "kl_estimator": ("k9", "must be one of k1, k2, k3"),
        "aggregation": ("sum", "must be one of token-mean, seq-mean"),
        "overlong": ("x", "must be one of train, mask, soft_penalty"),
        "overlong_cache": ("0", "must be in [1, inf)"),
        "reward": ("[a]", "must be a string"),  # its environment's checks: test_run_config
        "protocol": ("x", "must be one of bfcl, combined"),
        "tasks_from": ("[a]", "must be a string"),
        "save_every": ("-1", "must be in [0, inf)"),
        "seed": ("-1", "must be in [0, inf)"),
        "out_dir": ("[a]", "must be a string"),
        "heartbeat_s": ("-1.0", "must be in [0, inf)"),
        "stall_s": ("0", "must be in (0, inf)"),
    },
    "eval": {
        "split": ("x", "must be one of train, test"),
        "vllm_servers": ("-1", "must be in [0, inf)"),
        "vllm_gpu_memory_utilization": ("0", "must be in (0, 1]"),
        "protocol": ("x", "must be one of trained, bfcl, combined"),
        "other_protocol": ("maybe", "must be true or false"),
        "temperature": ("-1", "must be in [0, inf)"),
        "tokens": ("[high, best]", "must be a list of one of high, low, none"),
        "seeds": ("[a]", "must be a list of int"),
        "categories": ("[1]", "must be a list of string"),
        "task_file": ("[a]", "must be a string"),
        "limit": ("-1", "must be in [0, inf)"),
        "model_name": ("[a]", "must be a string"),
        "out_dir": ("[a]", "must be a string"),
    },
    "model": {
        "profile": ("nosuch", "must be one of tiny, qwen-shape, smollm2-135m, qwen2.5-7b"),
        "path": ("[a]", "must be a string"),
        "lora": ("maybe", "must be true or false or null"),
        "lora_r": ("0", "must be in [1, inf)"),
        "lora_alpha": ("0", "must be in (0, inf)"),
        "lora_dropout": ("1.0", "must be in [0, 1)"),
        "lora_target_modules": ("[1]", "must be a list of string"),
        "train_reward_rows": ("maybe", "must be true or false"),
        "compact_docs": ("maybe", "must be true or false or null"),
        "gradient_checkpointing": ("maybe", "must be true or false or null"),
        "dtype": ("float99", "must be one of auto, float32, bfloat16, float16"),
        "attention": ("flash", "must be one of auto, sdpa, flash_attention_2, eager"),
        "device": ("[a]", "must be a string"),
        "seed": ("-1", "must be in [0, inf)"),
    },
    "rollout": {
        "engine": ("x", "must be one of hf, vllm"),
        "protocol": ("x", "must be one of combined, bfcl"),
        "temperature": ("-1", "must be in [0, inf)"),
        "top_p": ("0", "must be in (0, 1]"),
        "max_new_tokens": ("-1", "must be in [0, inf)"),
        "max_total_tokens": ("-1", "must be in [0, inf)"),
        "max_steps": ("-1", "must be in [1, inf)"),
        "max_batch": ("0", "must be in [1, inf)"),
        "prefix_cache": ("maybe", "must be true or false"),
        "threads": ("-1", "must be in [0, inf)"),
        "vllm_gpu_memory_utilization": ("1.5", "must be in (0, 1]"),
        "vllm_max_lora_rank": ("-1", "must be in [0, inf)"),
        "scheduler": ("x", "must be one of async, lockstep"),
        "max_in_flight": ("0", "must be in [1, inf)"),
        "tool_workers": ("-1", "must be in [0, inf)"),
        "vllm_servers": ("0", "must be in [1, inf)"),
        "vllm_devices": ("[[0]]", "must be a list of string"),
        "tensor_parallel_size": ("0", "must be in [1, inf)"),
        "vllm_max_num_seqs": ("0", "must be in [1, inf)"),
        "vllm_prefix_caching": ("maybe", "must be true or false"),
        "vllm_sleep_mode": ("maybe", "must be true or false"),
    },
    "dataset": {
        "root": ("[a]", "must be a string"),
        "vllm_servers": ("-1", "must be in [0, inf)"),
        "vllm_gpu_memory_utilization": ("0", "must be in (0, 1]"),
        "data_dir": ("[a]", "must be a string"),
        "remote": ("[a]", "must be a string"),
        "docs_dir": ("[a]", "must be a string"),
        "protocol": ("x", "must be one of combined, bfcl"),
        "categories": ("[1]", "must be a list of string"),
        "train_tasks": ("-1", "must be in [0, inf)"),
        "test_tasks": ("-1", "must be in [0, inf)"),
        "train_categories": ("[1]", "must be a list of string"),
        "train_max_calls": ("-1", "must be in [0, inf)"),
        "low_per_high": ("0", "must be in (0, inf)"),
        "balance_tolerance": ("2", "must be in [0, 1]"),
        "kinds": ("[1]", "must be a list of string"),
        "attempts": ("0", "must be in [1, inf)"),
        "rollouts": ("maybe", "must be one of auto, on, off or true or false"),
        "rollout_profile": ("[a]", "must be a string"),
        "rollout_share": ("2", "must be in [0, 1]"),
        "commit": ("maybe", "must be true or false"),
        "push": ("maybe", "must be true or false"),
        "lock_timeout_s": ("-1", "must be in [0, inf)"),
        "seed": ("-1", "must be in [0, inf)"),
    },
    "env": {
        "name": ("nosuch", "must be one of bfcl, calculator, memory"),
        "tool_timeout_s": ("0", "must be in (0, inf)"),
        "tool_memory_mb": ("100", "must be in [256, inf)"),
        "max_observation_chars": ("10", "must be in [256, inf)"),
        "message_timeout_s": ("0", "must be in (0, inf)"),
        "episode_timeout_s": ("-1", "must be in (0, inf)"),
    },
    "execution": {
        "backend": ("spark", "must be one of local, ray"),
        "address": ("[a]", "must be a string"),
        "workers": ("0", "must be in [1, inf)"),
        "cpus_per_worker": ("-1.0", "must be in [0, inf)"),
        "gpus_per_worker": ("-1", "must be in [0, inf)"),
        "memory_per_worker_gb": ("-1", "must be in [0, inf)"),
        "shard_size": ("0", "must be in [1, inf)"),
        "max_retries": ("-1", "must be in [0, inf)"),
    },
    "traces": {
        "enabled": ("maybe", "must be true or false"),
        "rl_every": ("-1", "must be in [0, inf)"),
        "rl_groups": ("-2", "must be in [0, inf)"),
        "eval_every": ("-1", "must be in [0, inf)"),
        "max_chars": ("-5", "must be in [0, inf)"),
    },
    "retention": {
        "keep_last_checkpoints": ("-1", "must be in [0, inf)"),
        "mlflow_keep_runs": ("-3", "must be in [0, inf)"),
        "mlflow_max_age_days": ("-0.5", "must be in [0, inf)"),
        "dvc_keep_commits": ("-1", "must be in [0, inf)"),
        "dvc_cloud": ("maybe", "must be true or false"),
    },
}
ROWS = [(s, f, raw, says) for s, fields in BAD.items() for f, (raw, says) in fields.items()]


def _classes() -> dict:
    """config class -> the section the table uses for it (SFTConfig serves rctp and sft)."""
    out = {}
    for section in SECTIONS:
        out.setdefault(section_class(section), section)
    return out


def _numeric(hint) -> bool:
    base = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else hint
    return base in (int, float)


def test_every_field_of_every_stage_config_has_a_row_and_every_number_a_range():
    classes = _classes()
    exist = {(section, f.name) for cls, section in classes.items()
             for f in dataclasses.fields(cls)}  # fmt: skip
    covered = {(s, f) for s, f, _, _ in ROWS}
    print(f"settings covered: {len(covered & exist)} of {len(exist)} fields "
          f"({len(classes)} config classes)")  # fmt: skip
    assert covered == exist, {"no row": sorted(exist - covered), "no field": covered - exist}
    unranged = [
        f"{section}.{f.name}"
        for cls, section in classes.items()
        for f in dataclasses.fields(cls)
        if _numeric(typing.get_type_hints(cls)[f.name]) and "range" not in f.metadata
    ]
    assert not unranged, f"numeric fields without ranged(default, interval): {unranged}"


@pytest.mark.parametrize("section, field, raw, says", ROWS, ids=[f"{s}.{f}" for s, f, *_ in ROWS])
def test_a_bad_value_of_each_field_is_refused_by_set_and_params_yaml(
    tmp_path, section, field, raw, says
):
    with pytest.raises(ConfigError) as by_set:
        parse_sets([f"{section}.{field}={raw}"], sectioned=True)
    message = str(by_set.value)
    assert says in message and "\n" not in message, message
    assert message.startswith((f"{section}.{field}={raw}: ", f"{section}: ")), message
    params = tmp_path / "params.yaml"  # the same value written in a params file (--params)
    params.write_text(yaml.safe_dump({section: {field: yaml.safe_load(raw)}}))
    with pytest.raises(ConfigError, match=str(params)) as by_file:
        check_params([section], params)
    assert says in str(by_file.value), str(by_file.value)


def test_a_bad_value_in_a_preset_is_refused_naming_the_preset(tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("rl: {p_high: 0.5}\npresets:\n  quick: {rl: {p_high: 7.0}}\n")
    check_params(["rl"], params)  # the section alone is fine
    with pytest.raises(
        ConfigError, match=r"^rl.p_high=7.0: must be in \[0, 1\] \(.*presets.quick\)$"
    ):
        check_params(["rl"], params, preset="quick")


def test_good_values_still_load():
    assert parse_sets(["rctp.lr=1e-5"], sectioned=True) == {"rctp": {"lr": 1e-05}}
    assert parse_sets(["seeds=[0, 1]"], False, "eval") == {"seeds": [0, 1]}
    check_params(preset="paper")  # the checkout's params.yaml and its preset
    check_params(preset="paper")


def cli(*args, timeout=120):
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "rcgrpo.cli", *args], capture_output=True,
                         text=True, timeout=timeout)  # fmt: skip
    return out, time.perf_counter() - start


def one_line(out) -> str:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    "args, line",
    [  # the reported cases: a traceback, a silent no-op, or a late failure before
        (["run", "--set", "rl.p_high=7.0"], "error: rl.p_high=7.0: must be in [0, 1]"),
        (["run", "--set", "rollout.max_steps=-1"], "error: rollout.max_steps=-1: must be in [1, inf)"),
        (["run", "--set", "rl.clip_eps=-1.0"], "error: rl.clip_eps=-1.0: must be in (0, 1]"),
        (["run", "--set", "execution.cpus_per_worker=-1.0"],
         "error: execution.cpus_per_worker=-1.0: must be in [0, inf)"),
        (["stage", "rctp", "--set", "micro_batch_size=0"],
         "error: rctp.micro_batch_size=0: must be in [1, inf)"),
        (["stage", "rl", "--set", "lr=-1.0"], "error: rl.lr=-1.0: must be in (0, 1]"),
        (["stage", "rctp", "--set", "model.dtype=float99"],
         "error: model.dtype=float99: must be one of auto, float32, bfloat16, float16"),
        (["stage", "rctp", "--set", "epochs=-1"], "error: rctp.epochs=-1: must be in [1, inf)"),
        (["stage", "sft", "--set", "batch_size=-4"], "error: sft.batch_size=-4: must be in [1, inf)"),
        (["stage", "eval", "--set", "seeds=[a]"], "error: eval.seeds=[a]: must be a list of int"),
        (["stage", "eval", "--set", "limit=-1"], "error: eval.limit=-1: must be in [0, inf)"),
    ],
)  # fmt: skip
def test_reported_bad_settings_fail_in_one_line_at_once(args, line):
    out, wall = cli(*args)
    assert one_line(out) == line
    assert wall < 30, wall  # before any model, server or run: a few seconds of imports


def test_yaml_exponent_lr_is_accepted_by_the_cli(tmp_path):
    """`lr=1e-5` was refused as "not a float"; now it passes and the command goes on to its
    next check (an out_dir that cannot be written: refused before training)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    out, _ = cli("stage", "rctp", "--set", "lr=1e-5", "--set", f"out_dir={blocker / 'x'}")
    assert "is not writable" in one_line(out)


def test_a_data_dir_refusal_inside_run_is_one_line_and_quick():
    """Was ~18 s and a Prefect traceback (the refusal came from inside the data flow)."""
    out, wall = cli("run", "--set", "dataset.data_dir=dvc_remote")
    line = one_line(out)
    assert line.startswith("error: dataset.data_dir=dvc_remote: ") and "DVC remote" in line
    assert wall < 30 and "prefect" not in out.stdout.lower(), wall
