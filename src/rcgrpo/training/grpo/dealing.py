"""Which micro-batches each rank runs in the RL update: a mini-batch's micro-batches dealt over
the ranks by what each computes (`deal`), the first pass's share that pi_old and the reference
run (`first_pass_share`), and the share whose pi_old is taken before the first optimizer step
(`anchor_share`). Why by computed tokens: a shared-prefix micro-batch holds whole groups whose
prompts run once, so priced as padded rows it looked several times its cost and the slowest
rank waited (docs/balance.md).

    .venv/bin/pytest tests/test_balance.py -q
"""

from __future__ import annotations

import torch

from rcgrpo.training import balance, shared_forward
from rcgrpo.training.grpo.config import RLConfig


def deal(ranks, model, batch, mini: list) -> list[tuple[torch.Tensor, float]]:
    """This rank's share of a mini-batch's micro-batches (index tensors), with weights
    (Ranks.share): dealt by what each computes (balance.micro_costs, shared prefixes once
    where the model shares them), padded with the mini-batch's shortest row alone at weight 0."""
    if ranks.world == 1:
        return ranks.share(mini)
    shared = getattr(model, "training_attention", None) == shared_forward.NAME
    costs = balance.micro_costs(batch.ids, batch.attn, mini, balance.model_coef(model), shared)
    rows = torch.cat(mini)
    shortest = rows[batch.attn[rows].sum(1).argmin()].view(1)  # (1,) the filler
    return ranks.share(mini, costs, shortest)


def first_pass_share(ranks, model, batch, passes, start: int = 0) -> list[torch.Tensor]:
    """This rank's micro-batches (index tensors) of the first pass's mini-batches start..M-1,
    dealt as the update deals them (`deal`), the zero-weight padding left out: pi_old and the
    reference run the same forwards as the first update (ratio exactly 1)."""
    shares = (deal(ranks, model, batch, mini) for mini in passes[0][start:])
    return [c for share in shares for c, w in share if w]


def anchor_share(cfg: RLConfig, ranks, model, batch, passes) -> list[torch.Tensor]:
    """The micro-batches (this rank's) whose pi_old a no-grad forward computes before the first
    optimizer step: all of the first pass with `recompute`; with `engine` and rl.engine_is on,
    those of the mini-batches after the first (the first's come from its own forward); none in
    verl's bypass mode (`engine`, rl.engine_is none: pi_old is the engine's)."""
    if cfg.behaviour_logprobs == "recompute":
        return first_pass_share(ranks, model, batch, passes)
    if cfg.engine_is == "none":
        return []
    return first_pass_share(ranks, model, batch, passes, start=1)
