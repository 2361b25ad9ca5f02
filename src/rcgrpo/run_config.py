"""One run's settings, resolved once: params.yaml, then a preset, then `--set`s, then a variant.

`resolve` reads params.yaml at most once, merges the layers and builds every section's frozen
dataclass once (a bad value fails here, in one line naming the layer it came from), with the
project's relative paths made absolute. The result, a `RunConfig`, is what every stage takes:
nothing below re-reads params.yaml. It travels to the stages' processes (`rcgrpo stage NAME`,
torchrun ranks) as `run_config.json`, which `RunConfig.load` builds back through the same checks.

Every front resolves the same way: `rcgrpo run`, `rcgrpo stage NAME` without `--config` (what
dvc.yaml's stages run, so `dvc repro` and `dvc exp run` too), a scheduled run and `rcgrpo config
show`. A preset, variant or stage list not given is params.yaml `pipeline:`'s (`pipeline_defaults`),
so the same params.yaml gives the same run_config.json whichever front reads it.

Why the layers merge in this order: a preset is a named block of sections (`presets:`), the
`--set`s are this one run's choices so they win over it, and a variant (the paper's recipe,
rcgrpo.evaluation.variants) fixes RL's init/conditioning/p_high last; its evaluation goals only
fill `eval.tokens` where neither a preset nor a `--set` chose them.

    rc = resolve(read_params(), preset="paper", sets={"rl": {"steps": 2}})
    rc.write(Path("outputs/rl/run_config.json"));  RunConfig.load(that_path) == rc
    rcgrpo stage rl --config outputs/rl/run_config.json         # one stage, from the file
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcgrpo.config import SECTIONS, ConfigError, build, read_params, section_class, utf8
from rcgrpo.fields import show
from rcgrpo.runtime import project_root

PIPELINE_STAGES = ("data", "finetune", "rl", "eval")
TRAIN_STAGES = ("rctp", "sft", "rl")
# the held-out evaluation, and the RL tasks before and after RL (the pipeline's headline)
EVAL_STAGES = ("eval", "eval_rl_tasks_before", "eval_rl_tasks_after")
STAGES = ("data", *TRAIN_STAGES, *EVAL_STAGES)  # what `rcgrpo stage NAME` runs, one process each


@dataclass(frozen=True)
class Plan:
    """What `rcgrpo run` does with the sections: which stages, which recipe, on how many ranks."""

    stages: tuple[str, ...] = PIPELINE_STAGES
    variant: str = ""  # rcgrpo.evaluation.variants name; "" = the sections as they are
    preset: str = ""  # params.yaml presets.<name> applied; "" = none
    procs: int = 1  # processes per training stage and node (torchrun, one per GPU)
    root: str = ""  # the project the relative paths were resolved against
    nodes: int = 1  # nodes of a training stage, joined by torchrun's rendezvous
    rendezvous: str = ""  # HOST:PORT where the nodes' torchrun agents meet (nodes > 1)


@dataclass(frozen=True)
class RunConfig:
    """Every params.yaml section as this run uses it, one frozen dataclass each (named as in
    params.yaml: `rc.rl`, `rc.model`, ...), and the plan of the run."""

    rctp: Any
    sft: Any
    rl: Any
    eval: Any
    model: Any
    rollout: Any
    dataset: Any
    env: Any
    execution: Any
    traces: Any
    retention: Any
    plan: Plan = Plan()

    @property
    def sections(self) -> dict:
        return {k: getattr(self, k) for k in SECTIONS}

    def to_dict(self) -> dict:
        out = {k: dataclasses.asdict(v) for k, v in self.sections.items()}
        return {**out, "pipeline": dataclasses.asdict(self.plan)}

    def write(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> RunConfig:
        """A run_config.json back, every section checked again (a hand edit fails in one line)."""
        try:  # ValueError: bad JSON (its line), a number of over 4,300 digits
            data = json.loads(utf8(Path(path).read_bytes(), f"--config {path}"))
        except ConfigError:  # not UTF-8: its line
            raise
        except (OSError, ValueError) as e:
            reason = " ".join(str(e).split())[:200]
            raise ConfigError(
                f"--config {path}: not a readable run_config.json ({reason})"
            ) from None
        return cls.from_dict(data, f"--config {path}")

    @classmethod
    def from_dict(cls, data: dict, source: str = "run config") -> RunConfig:
        """`to_dict`'s output (e.g. a scheduled run's JSON parameter) back, checked again."""
        if not isinstance(data, dict) or "pipeline" not in data:
            raise ConfigError(f"{source}: not a run config (no `pipeline` section)")
        data = dict(data)
        plan_values = dict(data.pop("pipeline"))
        plan_values["stages"] = tuple(plan_values.get("stages", PIPELINE_STAGES))
        plan = build(Plan, plan_values, "pipeline", source)
        if unknown := sorted(set(data) - set(SECTIONS)):
            raise ConfigError(f"{source}: unknown sections {unknown}")
        # a section added after the file was written takes its defaults, as a field added to a
        # section does: a run config (or a scheduled run's parameter) from before still loads
        built = {k: build(section_class(k), data.get(k) or {}, k, source) for k in SECTIONS}
        return cls(**built, plan=plan)


def pipeline_defaults(params: dict) -> dict:
    """params.yaml `pipeline:` as every front reads it: {"stages", "variant", "preset"}."""
    pp = params.get("pipeline") or {}
    if not isinstance(pp, dict):
        raise ConfigError("pipeline: must be a mapping of stages, variant, preset (params.yaml)")
    if unknown := sorted(set(pp) - {"stages", "variant", "preset"}):
        raise ConfigError(f"pipeline: unknown key(s) {unknown}; allowed: stages, variant, preset")
    stages = pp.get("stages")
    return {
        "stages": tuple(PIPELINE_STAGES if stages is None else stages),
        "variant": pp.get("variant") or "",
        "preset": pp.get("preset") or "",
    }


def resolve(
    params: dict | Path | None = None,
    preset: str | None = None,
    variant: str | None = None,
    sets: dict[str, dict] | None = None,
    stages: list[str] | tuple[str, ...] | None = None,
    procs: int = 1,
    root: Path | None = None,
    nodes: int = 1,
    rendezvous: str = "",
) -> RunConfig:
    """params.yaml (a dict already read, a path, or None = the project's) + presets.<preset> +
    `sets` ({"rl": {"steps": 2}}: checked by rcgrpo.config.parse_sets) + the variant's RL fields
    -> a RunConfig with every section built once. Raises ConfigError naming the offending layer.
    preset, variant, stages: None or "" = params.yaml `pipeline:`'s (pipeline_defaults)."""
    root = Path(root or project_root())
    where = str(params) if isinstance(params, Path) else str(root / "params.yaml")
    if not isinstance(params, dict):
        params = read_params(params)
    chosen = pipeline_defaults(params)
    preset, variant = preset or chosen["preset"], variant or chosen["variant"]
    presets = params.get("presets") or {}
    if preset and preset not in presets:
        raise ConfigError(f"preset {preset!r} is not in params.yaml presets: {sorted(presets)}")
    layer = (presets.get(preset) or {}) if preset else {}
    if not isinstance(layer, dict):
        raise ConfigError(f"presets.{preset} must map sections to fields ({where})")
    stages = tuple(chosen["stages"] if stages is None else stages)
    if unknown := sorted(set(stages) - set(PIPELINE_STAGES)):
        raise ConfigError(f"unknown stages {unknown}: expected a subset of {PIPELINE_STAGES}")
    if procs < 1:
        raise ConfigError(f"--procs {procs}: must be >= 1")
    if nodes < 1:
        raise ConfigError(f"--nnodes {nodes}: must be >= 1")
    if nodes > 1 and not rendezvous.rpartition(":")[2].isdigit():
        raise ConfigError(f"--nnodes {nodes} needs --rdzv-endpoint HOST:PORT, got {rendezvous!r}")
    fixed: dict[str, list] = {"rl": [], "eval": []}
    if variant:
        from rcgrpo.evaluation.variants import get_variant

        try:
            v = get_variant(variant)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        fixed["rl"] = [(f"variant {variant}", v.rl_overrides())]  # the recipe wins
        fixed["eval"] = [(f"variant {variant}", {"tokens": list(v.eval_tokens)})]  # a default
    sets = sets or {}
    built = {}
    for name in SECTIONS:
        base = params.get(name) or {}
        if not isinstance(base, dict):
            raise ConfigError(f"{name}: must be a mapping of fields ({where})")
        given = [
            (f"{where} presets.{preset}", layer.get(name) or {}),
            (_sets_text(name, sets.get(name) or {}), sets.get(name) or {}),
        ]
        if name == "eval":
            layers = fixed["eval"] + given
        else:
            layers = given + fixed.get(name, [])
        built[name] = _build(name, base, layers, where)
    from rcgrpo.envs.config import check_sections

    try:  # the settings that name what the environment has: its protocols, categories, checks
        check_sections(built)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    plan = Plan(stages, variant, preset, procs, str(root), nodes, rendezvous)
    return RunConfig(**_absolute(built, root), plan=plan)


def _build(name: str, base: dict, layers: list, where: str):
    """The section built once; on failure, built layer by layer to name where the fault is."""
    cls = section_class(name)
    values = dict(base)
    for _, part in layers:
        values.update(part)
    try:
        return build(cls, values, name)
    except ConfigError:
        build(cls, base, name, where)  # params.yaml itself
        so_far = dict(base)
        for source, part in layers:
            so_far.update(part)
            build(cls, so_far, name, source)
        raise


def _sets_text(name: str, values: dict) -> str:
    return " ".join(f"--set {name}.{k}={show(v)}" for k, v in values.items()) or "--set"


def _absolute(built: dict, root: Path) -> dict:
    """params.yaml paths are relative to the project: absolute here, so any working dir works."""

    def fix(path: str) -> str:
        return path if not path or Path(path).is_absolute() else str(root / path)

    out = dict(built)
    for name in ("rctp", "sft"):
        cfg = built[name]
        out[name] = dataclasses.replace(cfg, data=fix(cfg.data), out_dir=fix(cfg.out_dir))
    rl = built["rl"]
    paths = {"out_dir": rl.out_dir, "init_path": rl.start_path, "tasks_from": rl.tasks_from}
    out["rl"] = dataclasses.replace(rl, **{k: fix(v) for k, v in paths.items()})
    ev = built["eval"]
    out["eval"] = dataclasses.replace(ev, out_dir=fix(ev.out_dir), task_file=fix(ev.task_file))
    return out


def stage_section(rc: RunConfig, stage: str):
    """The training stage's config (rctp | sft | rl)."""
    if stage not in TRAIN_STAGES:
        raise ConfigError(f"stage {stage!r}: expected one of {TRAIN_STAGES}")
    return getattr(rc, stage)


def stage_dir(rc: RunConfig, stage: str) -> Path:
    """Where a stage writes its run_config.json (and result.json): a training stage's out_dir,
    an evaluation's eval out_dir (eval_rl_tasks_*: beside it, rcgrpo.tracking.evaluation),
    the data stage's outputs/data (never inside the DVC-tracked data/)."""
    if stage in TRAIN_STAGES:
        return Path(stage_section(rc, stage).out_dir)
    if stage == "data":
        return Path(rc.plan.root or project_root()) / "outputs" / "data"
    if stage == "eval":
        return Path(rc.eval.out_dir)
    if stage in EVAL_STAGES:
        when = stage.rpartition("_")[2]
        return Path(rc.plan.root or project_root()) / "outputs" / "eval_rl_tasks" / when
    raise ConfigError(f"stage {stage!r}: expected one of {STAGES}")
