"""Engine importance sampling: correct the PPO loss for the gap between the rollout engine's
log-probs and the trainer's (vLLM in bf16 beside a trainer in fp32, another kernel, a stale sync).

The tokens were sampled by the engine's policy pi_engine, not by the trainer's pi_trainer, even
at the same weights. verl's rollout importance sampling (docs/advance/rollout_is.md) and
SkyRL's off-policy correction weight each token by the ratio rho = pi_trainer / pi_engine of the
sampled token, computed in log space and clamped to [-20, 20] before exp:

* `token`: the truncated weight w_t = min(rho_t, C) multiplies the per-token policy-gradient
  term (C = `rl.engine_is_cap`, default 2.0: verl's `rollout_is_threshold` and SkyRL's
  `token_tis_ratio_clip_high`). No gradient flows through w.
* `sequence`: the geometric mean ratio of a rollout, exp(mean over its sampled tokens of
  log rho_t), outside [1 - b, 1 + b] (b = `rl.engine_is_bound`, default 0.01: SkyRL's
  `geo_mask_low` 0.99 / `geo_mask_high` 1.01) masks the whole rollout out of the loss.

pi_trainer is the trainer's log-prob of the sampled token under the weights the engine sampled
from: the recomputed pi_old, or, with `rl.behaviour_logprobs: engine`, the first PPO pass's own
forward (rcgrpo.training.grpo.update). Pure functions; hand-computed tests:

    .venv/bin/pytest tests/test_zero_variance.py -q -k engine
"""

from __future__ import annotations

from typing import Literal

import torch

EngineIS = Literal["none", "token", "sequence"]


def log_ratio(trainer: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log rho = trainer - engine log-probs (B, T) on sampled tokens (mask (B, T) 1), 0 elsewhere,
    clamped to [-20, 20] as verl does (exp stays finite)."""
    zero = torch.zeros_like(trainer)
    return torch.where(mask.bool(), trainer - engine, zero).clamp(-20.0, 20.0)


def sequence_ratio(trainer, engine, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """The geometric mean ratio of each rollout (B,) and whether it has sampled tokens (B,)."""
    n = mask.sum(dim=1)  # (B,)
    mean = (log_ratio(trainer, engine, mask) * mask).sum(dim=1) / n.clamp(min=1)
    return torch.exp(mean), n > 0


def weights(
    kind: EngineIS, trainer, engine, mask, cap: float, bound: float
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(is_weight, keep), each (B, T) or None, for core_algos.policy_loss: `token` gives the
    truncated weight min(rho, cap) (0 off the sampled tokens), `sequence` gives keep 1 on the
    rollouts whose geometric mean ratio is within [1 - bound, 1 + bound] and 0 on the others,
    `none` neither. trainer, engine, mask: (B, T) on one device."""
    if kind == "none":
        return None, None
    if kind == "token":
        rho = torch.exp(log_ratio(trainer, engine, mask))
        return rho.clamp(max=cap) * mask, None
    if kind == "sequence":
        geo, _ = sequence_ratio(trainer, engine, mask)
        inside = (geo >= 1.0 - bound) & (geo <= 1.0 + bound)  # (B,)
        return None, inside.to(mask.dtype)[:, None].expand_as(mask)
    raise ValueError(f"rl.engine_is must be 'none', 'token' or 'sequence', got {kind!r}")


def metrics(kind: EngineIS, trainer, engine, mask, cap: float, bound: float) -> dict[str, float]:
    """The step's rollout/engine_is_* (docs/metrics.md) over the whole batch (B, T): `token`:
    the mean applied weight and the largest ratio over sampled tokens, and the share of them
    truncated (rho > cap); `sequence`: the mean and largest geometric mean ratio over rollouts,
    and the share of them masked. `none`: no metric (rollout/logprob_gap still says the gap)."""
    mask = mask.to(torch.float32)
    if kind == "none" or not mask.any():
        return {}
    if kind == "token":
        rho = torch.exp(log_ratio(trainer, engine, mask))[mask.bool()]  # (N,) sampled tokens
        mean, top, cut = rho.clamp(max=cap).mean(), rho.max(), (rho > cap).float().mean()
    else:
        geo, has = sequence_ratio(trainer, engine, mask)
        geo = geo[has]  # (B',) rollouts with sampled tokens
        outside = (geo < 1.0 - bound) | (geo > 1.0 + bound)
        mean, top, cut = geo.mean(), geo.max(), outside.float().mean()
    return {
        "rollout/engine_is_mean": float(mean),
        "rollout/engine_is_max": float(top),
        "rollout/engine_is_clipped": float(cut),
    }


def check(cfg, temperature: float, engine=None) -> None:
    """A one-line error when `rl.behaviour_logprobs: engine` or `rl.engine_is` cannot be served:
    an engine without sampled-token log-probs (its `logprobs_temperature` None or missing), or
    a sampling temperature other than 1 (the engines return log-probs at temperature 1, the
    trainer's pi_old is at the sampling temperature: the ratio would measure the temperature)."""
    if cfg.behaviour_logprobs == "recompute" and cfg.engine_is == "none":
        return
    what = (
        "rl.behaviour_logprobs=engine"
        if cfg.behaviour_logprobs == "engine"
        else f"rl.engine_is={cfg.engine_is}"
    )
    if engine is not None and getattr(engine, "logprobs_temperature", None) is None:
        name = getattr(getattr(engine, "cfg", None), "engine", type(engine).__name__)
        raise ValueError(
            f"{what}: the rollout engine {name!r} returns no sampled-token log-probs; "
            "use rl.behaviour_logprobs=recompute and rl.engine_is=none"
        )
    if temperature != 1.0:
        raise ValueError(
            f"{what} needs rollout.temperature 1, got {temperature}: the engines return "
            "log-probs at temperature 1 and the trainer's are at the sampling temperature; "
            "use rl.behaviour_logprobs=recompute and rl.engine_is=none"
        )
