"""Rollout engines behind one interface (`Engine.rollout`, `Engine.sync`), chosen by config.

from rcgrpo.engines import RolloutConfig, make_engine
engine = make_engine(load_section("rollout", RolloutConfig), policy)
"""

from __future__ import annotations

from rcgrpo.engines.base import Engine, RolloutConfig, Sample


def make_engine(cfg: RolloutConfig, policy) -> Engine:
    """The engine `cfg.engine` names: "hf" (transformers) or "vllm" (imported only here)."""
    if cfg.engine == "vllm":
        from rcgrpo.engines.vllm_engine import VLLMEngine

        return VLLMEngine(cfg, policy)
    from rcgrpo.engines.hf import HFEngine

    return HFEngine(cfg, policy)


__all__ = ["Engine", "RolloutConfig", "Sample", "make_engine"]
