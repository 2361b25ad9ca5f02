"""The `eval:` section of params.yaml: which tasks, protocol, reward goals and seeds an
evaluation runs (rcgrpo.evaluation.evaluate runs it).

    rcgrpo config show eval
"""

from __future__ import annotations

from typing import Literal

from rcgrpo.fields import config_class, ranged, setting


@config_class
class EvalConfig:
    """params.yaml `eval:` section."""

    split: Literal["train", "test"] = setting("test", 'held-out tasks are "test" (80)')
    protocol: Literal["trained", "bfcl", "combined"] = setting(
        "trained", "trained: the one the model was trained with (its saved policy says which)"
    )
    other_protocol: bool = setting(True, "also score tokens[0] in the other protocol, beside")
    temperature: float = ranged(
        0.0, "[0, inf)", "0 = greedy (bfcl-eval runs at ~0); > 0 samples, a seed per pass"
    )
    tokens: tuple[Literal["high", "low", "none"], ...] = setting(
        ("high",), "reward goals, one pass each; [high, low] gives the controllability gap"
    )
    seeds: tuple[int, ...] = ranged((0,), "[0, inf)", "one full pass over the tasks per seed")
    categories: tuple[str, ...] = setting(
        (), "the environment's task categories to include ([] = all; BFCL: base, miss_func, ...)"
    )
    task_file: str = setting("", "only the tasks of this dataset file (JSONL), e.g. the RL tasks")
    limit: int = ranged(0, "[0, inf)", "first N tasks per category (0 = all), quick checks only")
    model_name: str = setting("rcgrpo", "folder name in the bfcl-eval result layout")
    vllm_servers: int = ranged(
        0, "[0, inf)", "vllm: this stage's servers (0 = one per visible GPU; CPU: rollout's)"
    )
    vllm_gpu_memory_utilization: float = ranged(
        0.85, "(0, 1]", "vllm: share of each GPU for this stage's servers (no trainer beside)"
    )
    out_dir: str = setting("outputs/eval", "report.json, outcomes.jsonl, bfcl_results/")

    def __post_init__(self):
        if not self.tokens:  # the one rule no declaration carries
            raise ValueError("eval.tokens must name at least one reward goal (high, low, none)")
