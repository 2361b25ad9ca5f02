"""The inputs of the GPU probe's update cases, and the FLOPs each one runs (scripts/
gpu_update_probe.py, scripts/gpu_day_one.py). Needs only torch and src/.

* `one_episode`: one row of random ids with a share of it sampled (the worst case).
* `replayed`: one rank's rollouts of a paper mini-batch drawn from the replayed ground truths
  (rcgrpo.training.plan.timing.draw_step, groups of 5): the G rollouts of a task share their
  first prompt but for its last PREFIX_TAIL tokens (the goal onward), as the rollout engine
  samples them; `scale` divides every segment (the CPU smoke's short rows).
* `first_micro_batch`: the first micro-batch the trainer forms from them, through its own
  schedule (rcgrpo.training.grpo.core_algos.minibatch_indices): padded rows, or with shared
  prompt prefixes (`rl.shared_prefix`, the default) the token budget counting what the shared
  forward computes.
* `work`: what a case's forward computes (tokens, attended pairs, head positions), as
  rcgrpo.training.plan.flops counts it: padded rows compute and attend their full width; shared
  rows their prefixes once (rcgrpo.training.shared_prefix.share_groups, the trainer's clusters).

    .venv/bin/python scripts/gpu_update_probe.py --smoke
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

TEXT_ROWS = 151_643  # Qwen2.5's text tokens: the random ids stay below the special ones


def one_episode(tokens: int, share: float):
    """One row of `tokens` random ids, `share` of the targets sampled: ids, attn (1, T), mask
    (1, T-1)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, TEXT_ROWS, (1, tokens), generator=g)
    mask = (torch.rand(1, tokens - 1, generator=g) < share).float()
    return ids, torch.ones_like(ids), mask


def replayed(rows: int, scale: int = 1, group: int = 5) -> list[SimpleNamespace]:
    """`rows` rollouts (whole groups of `group`) shaped as replayed ground truths, each with
    ids, loss_mask and logprobs as the trainer holds them; a group's rows share their first
    prompt but for its last PREFIX_TAIL tokens."""
    from rcgrpo.training.plan.timing import PREFIX_TAIL, draw_step, episode_shapes

    g = torch.Generator().manual_seed(0)
    out = []
    for shapes in draw_step(episode_shapes(), max(1, rows // group), group):
        shape = [(math.ceil(p / scale), math.ceil(s / scale)) for p, s in shapes[0]]
        common = max(0, shape[0][0] - PREFIX_TAIL)
        prompt = torch.randint(0, TEXT_ROWS, (common,), generator=g).tolist()
        for _ in shapes:
            loss_mask = [m for p, s in shape for m in [0] * p + [1] * s]
            rest = torch.randint(0, TEXT_ROWS, (len(loss_mask) - common,), generator=g).tolist()
            ids = prompt + rest
            out.append(SimpleNamespace(ids=ids, loss_mask=loss_mask, logprobs=[0.0] * len(ids)))
    return out


def first_micro_batch(rollouts, tokens: int, shared: bool, max_sampled: int = 0):
    """The first micro-batch of one pass over `rollouts` (one mini-batch), as the trainer forms
    it with a budget of `tokens`: ids, attn (B, T) right-padded, mask (B, T-1)."""
    from rcgrpo.training.grpo.core_algos import minibatch_indices
    from rcgrpo.training.grpo.update import to_batch

    lengths = [len(r.ids) for r in rollouts]
    sampled = [sum(r.loss_mask) for r in rollouts]
    rows = [r.ids for r in rollouts] if shared else None
    passes = minibatch_indices(
        len(rollouts), 0, 1, 1, None, lengths, tokens, False, sampled, max_sampled, rows
    )
    first = passes[0][0][0].tolist()
    batch = to_batch([rollouts[i] for i in first])
    return batch.ids, batch.attn, batch.mask


def work(ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor, shared: bool):
    """flops.Work of one forward over this micro-batch: padded rows (B x T computed and
    attended causally) or shared prefixes (each cluster's prefix once, suffixes over it)."""
    from rcgrpo.training.plan.flops import Work, causal_pairs, shared_pairs
    from rcgrpo.training.shared_prefix import share_groups

    sampled = float(mask.sum())
    if not shared:
        b, t = ids.shape
        return Work(b * t, causal_pairs([t] * b), sampled)
    lengths = attn.sum(1).tolist()
    rows = [ids[i, :n].tolist() for i, n in enumerate(lengths)]
    tokens = pairs = 0.0
    for members, p in share_groups(rows):
        suffixes = [len(rows[r]) - p for r in members if len(rows[r]) > p]
        tokens += p + sum(suffixes)
        pairs += shared_pairs(p, suffixes)
    return Work(tokens, pairs, sampled)


def probe_arch(cfg):
    """The plan's Arch of the probe's transformers config (random-init, untied)."""
    from rcgrpo.training.plan.constants import Arch

    return Arch(
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.vocab_size,
        False,
        "probe",
    )
