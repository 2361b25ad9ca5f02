"""Over-long episodes: what training does with an episode the token budget stopped.

Such an episode scores 0 because it ran out of room, not because the policy chose a wrong call,
so training against it like any other failure teaches "be shorter" by accident. DAPO (arXiv
2503.14476, section 3.4) offers two fixes, both here (`rl.overlong`):

* `train` (default): no special case, the behaviour before this setting existed.
* `mask`: the episode keeps its reward in its group's statistics (the group's other rollouts
  are scored against the same mean) but its loss mask is all 0, so it adds no gradient itself.
* `soft_penalty`: DAPO's soft over-long punishment added to the training reward, with
  L the episode length (prompt + every turn, what the budget counts), L_max = the budget
  (`rollout.max_total_tokens`) and L_c = `rl.overlong_cache`:

      R_len(L) = 0                          if L <= L_max - L_c
               = ((L_max - L_c) - L) / L_c  if L_max - L_c < L <= L_max
               = -1                         if L > L_max

Pure functions; tests/test_zero_variance.py checks hand-computed values:

    .venv/bin/pytest tests/test_zero_variance.py -q
"""

from __future__ import annotations

from typing import Literal

import torch

OverlongKind = Literal["train", "mask", "soft_penalty"]


def soft_overlong_penalty(lengths: torch.Tensor, max_len: int, cache: int) -> torch.Tensor:
    """DAPO's R_len, (B,) episode lengths -> (B,) penalties in [-1, 0] (formula above)."""
    if cache < 1 or cache > max_len:
        raise ValueError(
            f"rl.overlong_cache must be in [1, max_total_tokens={max_len}], got {cache}"
        )
    lengths = lengths.to(torch.float32)
    start = max_len - cache  # penalty starts above this length
    ramp = (start - lengths) / cache  # (B,)
    return torch.where(lengths <= start, torch.zeros_like(ramp), ramp.clamp(min=-1.0))


def apply_overlong(
    kind: OverlongKind,
    rewards: torch.Tensor,
    loss_masks: list[torch.Tensor],
    truncated: torch.Tensor,
    lengths: torch.Tensor,
    max_len: int,
    cache: int,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """rewards (n, G); loss_masks (n*G,) of (T_i,); truncated (n*G,) bool, stopped by the budget;
    lengths (n*G,) episode lengths -> (training rewards (n, G), loss masks). Inputs untouched."""
    if kind == "train":
        return rewards, loss_masks
    if kind == "mask":
        cut = truncated.tolist()
        masks = [torch.zeros_like(m) if t else m for m, t in zip(loss_masks, cut, strict=True)]
        return rewards, masks
    if kind == "soft_penalty":
        penalty = soft_overlong_penalty(lengths, max_len, cache).view_as(rewards)
        return rewards + penalty, loss_masks
    raise ValueError(f"rl.overlong must be 'train', 'mask' or 'soft_penalty', got {kind!r}")
