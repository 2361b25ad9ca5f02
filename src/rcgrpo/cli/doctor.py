"""`rcgrpo doctor`: what this machine gives a run (torch, CUDA, driver, GPUs, the vLLM venv,
flash-attn, and the device / dtype / attention / engine each model profile resolves to here),
and the CPU refusal `rcgrpo run` and `rcgrpo stage` apply before anything starts.

    rcgrpo doctor
    rcgrpo doctor --skip-vllm     # without starting the vLLM venv's python (~20 s on 2 cores)
"""

from __future__ import annotations

import os

import typer


def doctor(
    skip_vllm: bool = typer.Option(False, help="do not import vllm in its venv"),
    preset: str = typer.Option("", help="the preset whose rollout.engine is shown"),
) -> None:
    """Print what this machine gives a run; every line is measured here, nothing assumed."""
    from rcgrpo.cli.plan import resolve
    from rcgrpo.rollout import host

    facts = host.torch_facts()
    facts.update({} if skip_vllm else host.vllm_facts())
    facts["flash-attn"] = host.flash_attn()
    width = max(map(len, facts))
    for key, value in facts.items():
        typer.echo(f"{key:<{width}}  {value}")
    engine = resolve(preset, [], "")["rollout"].engine
    typer.echo(
        f"\nmodel profiles here (model.device/dtype/attention auto; rollout.engine of "
        f"preset {preset or 'default'}):"
    )
    rows = [
        ("profile", "source", "device", "dtype", "attention", "engine"),
        *host.profile_rows(engine),
    ]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(f"{str(c):<{w}}" for c, w in zip(row, widths, strict=True)).rstrip())


def refuse_cpu(what: str, profile: str, engine: str, procs: int, allow_cpu: bool) -> None:
    """ConfigError (one line, before anything starts) for a GPU-sized run on the CPU, unless
    allow_cpu, which is passed on to the stages' processes (env RCGRPO_ALLOW_CPU)."""
    from rcgrpo.config import ConfigError
    from rcgrpo.rollout import host

    if allow_cpu:
        os.environ[host.ALLOW_CPU_ENV] = "1"
    if message := host.cpu_refusal(profile, procs, engine, what):
        raise ConfigError(message)


def refuse_cpu_run(preset: str, sets: list[str], profile: str, procs: int, allow: bool) -> None:
    """refuse_cpu for `rcgrpo run`: the profile and engine as the run resolves them."""
    from rcgrpo.cli.plan import resolve

    cfg = resolve(preset, sets, profile)
    refuse_cpu("rcgrpo run", cfg["model"].profile, cfg["rollout"].engine, procs, allow)
