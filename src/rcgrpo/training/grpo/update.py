"""The PPO update of one RL step: pi_old and reference log-probs once, then clipped-loss
mini-batches, one optimizer step each (verl's ppo_mini_batch_size).

pi_old (`rl.behaviour_logprobs: recompute`) is computed ONCE per batch, before any update, with
the weights the engine sampled from (in eval mode, as the engine samples); same micro-batches as
the first update, so its forwards are bit-identical (ratio exactly 1); from the second update on
the ratio leaves 1 and the clip acts. With `engine` pi_old is the engine's log-probs (verl's
bypass mode), or, with `rl.engine_is` on, the trainer's own log-probs before any optimizer step,
the engine's being the behaviour policy of the importance weight (verl's decoupled mode): the
first mini-batch's come from its own first forward (no step has run yet), those of every later
mini-batch of the first pass from a no-grad forward before the first step, since by its turn
1..M-1 steps have moved the weights (`anchor_share`). The engine gap (rollout/logprob_gap) is
measured on log-probs of the sampled weights only (`engine_gap`).
A micro-batch is an index tensor into the step's padded batch (B, T); its forward computes
only its own width, the longest of its members (`width`), not the batch's T: with
token-budget micro-batches (core_algos.minibatch_indices, rcgrpo.training.batching) a
micro-batch of short rollouts never pays for the step's longest one.
Log-probs and entropy use the LM head at sampled positions only, in chunks, never (B, T, V)
(rcgrpo.training.forward.masked_hidden, rcgrpo.training.grpo.head). Under `accelerate launch` each rank runs its share of
each mini-batch's micro-batches and gradients are all-reduced once per optimizer step, with the
loss weighted by the GLOBAL mini-batch's tokens (or sequences), so N ranks make the 1-rank step.
The batch stays in host memory (B x T of the paper preset is GBs); each micro-batch goes to the
model's device (the rank's GPU) for its forward, and pi_old / the reference come back to the
host, where the trainer sums the ranks' shares (rcgrpo.training.distributed).

    .venv/bin/pytest tests/test_trainer.py tests/test_rl_memory.py -q
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rcgrpo.training import balance, shared_forward
from rcgrpo.training.forward import masked_hidden, scatter, with_training_attention
from rcgrpo.training.grpo import engine_is
from rcgrpo.training.grpo.config import RLConfig, step_seed
from rcgrpo.training.grpo.core_algos import minibatch_indices, policy_loss
from rcgrpo.training.grpo.head import head_logprobs


@dataclass
class Batch:
    """Rollouts as tensors, aligned with the predicted tokens (position t predicts ids[:, t+1])."""

    ids: torch.Tensor  # (B, T) sampled token ids, right-padded
    attn: torch.Tensor  # (B, T) 1 on real tokens
    mask: torch.Tensor  # (B, T-1) 1 where ids[:, 1:] was sampled by the policy (loss positions)
    sampled_logp: torch.Tensor  # (B, T-1) the engine's log-probs of ids[:, 1:] (T = 1)


def batch_tensors(rollouts, pad_id: int = 0):
    """Rollouts -> ids (B, T), loss mask (B, T), sampling logprobs (B, T), attention (B, T)."""
    T = max(len(r.ids) for r in rollouts)
    B = len(rollouts)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    mask, logp, attn = torch.zeros(B, T), torch.zeros(B, T), torch.zeros(B, T, dtype=torch.long)
    for i, r in enumerate(rollouts):
        n = len(r.ids)
        ids[i, :n] = torch.as_tensor(r.ids)
        mask[i, :n] = torch.as_tensor(r.loss_mask, dtype=torch.float32)
        logp[i, :n] = torch.as_tensor(r.logprobs, dtype=torch.float32)
        attn[i, :n] = 1
    return ids, mask, logp, attn


def to_batch(rollouts, pad_id: int = 0) -> Batch:
    ids, mask, logp, attn = batch_tensors(rollouts, pad_id)
    return Batch(ids, attn, mask[:, 1:], logp[:, 1:])


def width(attn: torch.Tensor, c: torch.Tensor) -> int:
    """Columns micro-batch c (row indices) needs: its longest member, attn (B, T) 1 on tokens."""
    return int(attn[c].sum(1).max())


def device_of(model) -> torch.device:
    return next(model.parameters()).device


@with_training_attention  # the reference copy too: its prefixes shared like the policy's
def logprobs(model, ids, attn, mask, temperature: float = 1.0):
    """Log-probs of ids[:, 1:] at the sampling temperature, (B, T-1) with 0 where mask (B, T-1)
    is 0; the entropy and T = 1 log-probs at the N sampled positions (head.Sampled, no grad)
    and those positions, where (B, T-1). The LM head runs in chunks (rcgrpo.training.grpo.head:
    its memory does not grow with the sampled share). All on the model's device (the inputs
    are moved there)."""
    dev = device_of(model)
    ids, attn, mask = ids.to(dev), attn.to(dev), mask.to(dev)
    forward = shared_forward.shared_hidden if shared_forward.active(model) else masked_hidden
    hidden, where, head = forward(model, ids, attn, mask)  # shared: prefixes computed once
    logp, sampled = head_logprobs(head, hidden, ids[:, 1:][where], temperature)
    return scatter(logp, where), sampled, where


def first_pass_share(ranks, batch: Batch, passes, start: int = 0) -> list[torch.Tensor]:
    """This rank's micro-batches (index tensors) of the first pass's mini-batches start..M-1,
    the zero-weight padding left out: pi_old and the reference run the same forwards as the
    first update (ratio exactly 1)."""
    minis = passes[0][start:]
    rows = [[balance.padded_rows(batch.attn, c) for c in mini] for mini in minis]
    shares = (ranks.share(mini, r) for mini, r in zip(minis, rows, strict=True))
    return [c for share in shares for c, w in share if w]


def anchor_share(cfg: RLConfig, ranks, batch: Batch, passes) -> list[torch.Tensor]:
    """The micro-batches (this rank's) whose pi_old a no-grad forward computes before the first
    optimizer step: all of the first pass with `recompute`; with `engine` and rl.engine_is on,
    those of the mini-batches after the first (the first's come from its own forward); none in
    verl's bypass mode (`engine`, rl.engine_is none: pi_old is the engine's)."""
    if cfg.behaviour_logprobs == "recompute":
        return first_pass_share(ranks, batch, passes)
    if cfg.engine_is == "none":
        return []
    return first_pass_share(ranks, batch, passes, start=1)


def engine_gap(cfg: RLConfig, batch: Batch, old, first, gap, passes):
    """The mean |engine - trainer| log-prob gap per sampled token and the step's
    rollout/engine_is_* metrics (engine_is.metrics, {} without rl.engine_is). With `recompute`
    the trainer's are pi_old (`gap`: behaviour_logprobs' sum over the batch). With `engine`
    (old None) they are `first` (B, T-1): taken before any optimizer step on every row with
    rl.engine_is on, else on the first mini-batch's rows only (the others' first forward ran
    after 1..M-1 steps: their gap would mix in the policy's own drift), so the gap is over those."""
    trainer = old if first is None else first  # (B, T-1) pi_old as the trainer computes it
    mask = batch.mask
    if first is not None:
        if cfg.engine_is == "none":  # the rows of the first mini-batch of the first pass
            rows = torch.zeros(mask.shape[0], 1, dtype=mask.dtype)
            rows[torch.cat(passes[0][0])] = 1
            mask = mask * rows
        gap = ((batch.sampled_logp - first).abs() * mask).sum()
    args = (trainer, batch.sampled_logp, batch.mask, cfg.engine_is_cap, cfg.engine_is_bound)
    return float(gap / mask.sum().clamp(min=1)), engine_is.metrics(cfg.engine_is, *args)


@with_training_attention  # flash-attention where chosen; the engines keep the loaded one
@torch.no_grad()
def behaviour_logprobs(
    model,
    batch: Batch,
    micro_batches,
    logprob_fn,
    temperature: float,
    ref_fn=None,
    anchors=None,
):
    """pi_old (B, T-1) on the rows of `anchors` (index tensors; None: all of `micro_batches`,
    zeros elsewhere), the reference's (B, T-1) over `micro_batches` or None, and the summed
    |engine - trainer| log-prob gap over the anchors' sampled tokens, in eval mode.
    logprob_fn(model, ids, attn, mask) -> `logprobs` at the sampling temperature;
    ref_fn(ids, attn, mask) -> the reference's log-probs of one micro-batch (None: no KL).
    anchors: which micro-batches need a pi_old forward (`anchor_share`)."""
    ids, attn, mask = batch.ids, batch.attn, batch.mask
    old = torch.zeros_like(mask)  # (B, T-1)
    ref = torch.zeros_like(mask) if ref_fn is not None else None
    gap = torch.zeros(())  # sum over sampled tokens of |engine log p - trainer log p|
    model.eval()
    for c in micro_batches if anchors is None else anchors:
        cols = width(attn, c)  # (b, cols) inputs, (b, cols-1) targets
        x, a, m = ids[c, :cols], attn[c, :cols], mask[c, : cols - 1]
        mine, sampled, where = logprob_fn(model, x, a, m)  # on the model's device
        dev = mine.device
        old[c, : cols - 1] = mine.to(old.device)
        if temperature != 1.0:
            mine = scatter(sampled.logp1, where)  # the engine's log-probs are at T = 1
        engine = batch.sampled_logp[c, : cols - 1].to(dev)
        gap += ((engine - mine).abs() * m.to(dev)).sum().cpu()
    for c in micro_batches if ref is not None else ():
        cols = width(attn, c)
        ref[c, : cols - 1] = ref_fn(ids[c, :cols], attn[c, :cols], mask[c, : cols - 1]).to(
            ref.device
        )
    return old, ref, gap


@with_training_attention  # over forwards and backwards (checkpointed layers recompute)
def ppo_updates(
    model,
    optimizer,
    ranks,
    batch: Batch,
    old,
    ref,
    adv,
    passes,
    cfg: RLConfig,
    logprob_fn,
    first: torch.Tensor | None = None,
) -> list[dict[str, float]]:
    """Every mini-batch of every pass: clipped loss + KL, accumulated over its micro-batches,
    one optimizer step. Returns the stats of each optimizer step (token- or sequence-weighted
    means over the mini-batch, summed over ranks) with its grad_norm.
    old: the recomputed pi_old (B, T-1), or None (`rl.behaviour_logprobs: engine`, module
    docstring); then `first` (B, T-1) holds this rank's pre-step log-probs of the first pass's
    later mini-batches (`anchor_share`; zeros without rl.engine_is), the first mini-batch's are
    written from its own forward, and the whole is summed over the ranks. The `rl.engine_is`
    weight compares pi_old with the engine's.
    logprob_fn(model, ids, attn, mask) -> `logprobs` at the sampling temperature (run inside
    the DDP wrapper)."""
    ids, attn, mask = batch.ids, batch.attn, batch.mask
    if old is not None:
        first = None
    elif first is None:
        first = torch.zeros_like(mask)
    lazy = old is None and cfg.engine_is != "none"  # pi_old = the first pass's own
    if old is None and not lazy:
        old = batch.sampled_logp  # verl's bypass: the PPO ratio is pi / pi_engine

    def size(c):  # what a micro-batch weighs in its mini-batch's mean: tokens or sequences
        return mask[c].sum() if cfg.aggregation == "token-mean" else (mask[c].sum(1) > 0).sum()

    dev = device_of(model)
    model.train()
    updates: list[dict[str, float]] = []
    merged = first is None  # each rank fills its own rows of `first`, then they are summed
    for p, j, mini in ((p, j, mini) for p, one in enumerate(passes) for j, mini in enumerate(one)):
        if p == 1 and not merged:
            first.copy_(ranks.merge(first)[0])
            merged = True
        optimizer.zero_grad(set_to_none=True)
        total = sum(size(c) for c in mini).clamp(min=1)
        upd: dict[str, float] = {}
        # (micro-batch, 1.0); under accelerate this rank's share, + zero-weight padding
        mine = ranks.share(mini, [balance.padded_rows(attn, c) for c in mini])
        for i, (c, share) in enumerate(mine):
            cols = width(attn, c)  # its longest member: (b, cols) in, (b, cols-1) out
            m = mask[c, : cols - 1]
            # under accelerate: through the DDP/FSDP wrapper, all-reduced on the last one
            with ranks.syncing(i, len(mine)):
                logp, sampled, where = ranks.forward(logprob_fn, ids[c, :cols], attn[c, :cols], m)
                if first is not None and p == j == 0 and share:  # before any step
                    first[c, : cols - 1] = logp.detach().to(first.device)
                if lazy and p == j == 0:
                    anchor = logp.detach()
                else:
                    anchor = (first if lazy else old)[c, : cols - 1].to(dev)
                weight, keep = engine_is.weights(
                    cfg.engine_is,
                    anchor,
                    batch.sampled_logp[c, : cols - 1].to(dev),
                    m.to(dev),
                    cfg.engine_is_cap,
                    cfg.engine_is_bound,
                )
                loss, stats = policy_loss(  # this micro-batch's slices on the model's device
                    logp,
                    anchor,
                    adv[c].to(dev),
                    m.to(dev),
                    None if ref is None else ref[c, : cols - 1].to(dev),
                    clip_eps=cfg.clip_eps,
                    kl_coef=cfg.kl_coef,
                    kl_estimator=cfg.kl_estimator,
                    aggregation=cfg.aggregation,
                    entropy=scatter(sampled.entropy, where),
                    is_weight=weight,
                    keep=keep,
                )
                w = size(c) / total * share  # token (or sequence) share of the GLOBAL mini-batch
                ranks.backward(loss * w)
            stats["total"] = loss.item()
            for k, v in stats.items():
                upd[k] = upd.get(k, 0.0) + float(w) * v
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        # the mini-batch's stats: sums over the ranks' shares
        upd = dict(zip(upd, ranks.sum(list(upd.values())), strict=True))
        upd["grad_norm"] = float(ranks.clip(max_norm))
        optimizer.step()
        updates.append(upd)
    if not merged:
        first.copy_(ranks.merge(first)[0])
    model.eval()
    return updates


def schedule(cfg: RLConfig, rollouts: list, step: int, packed: bool, shared: bool) -> list:
    """The step's PPO passes of mini-batches of micro-batch index tensors
    (core_algos.minibatch_indices). The shuffle has a generator of its own, seeded by the step
    (not by draw's stream), so that a resumed run visits the rollouts in the same order."""
    shuffle = torch.Generator().manual_seed(2**32 + step_seed(cfg.seed, step))
    return minibatch_indices(
        len(rollouts),
        cfg.mini_batch_size,
        cfg.micro_batch_size,
        cfg.inner_epochs,
        shuffle,
        [len(r.ids) for r in rollouts],
        cfg.max_tokens_per_micro_batch,
        packed,
        [int(r.loss_mask.sum()) for r in rollouts],
        cfg.max_sampled_per_micro_batch,
        [r.ids.tolist() for r in rollouts] if shared else None,  # sharing: computed tokens
    )
