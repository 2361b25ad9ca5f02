"""The shared-prefix forward: a micro-batch's common prompt prefixes computed once, each suffix
attending to [its prefix; itself], with outputs and gradients equal to the padded forward's.

How: the micro-batch becomes one packed row (rcgrpo.training.shared_prefix.pack: per cluster of
rows, the prefix once, then each row's suffix, with position ids restarting per sequence so RoPE
sees the unshared positions). The linear layers (projections, MLP, norms) run once per packed
token. The attention is a registered transformers attention function (`NAME`) that reads the
blocks from a keyword argument and runs, per layer and block, the prefix's causal
self-attention, then its suffixes over [prefix keys; own keys] with a bottom-right causal mask
that is never built: rcgrpo.training.suffix_attention, at causal FLOPs. Why this and not the KV
cache (prefix with use_cache, then the suffixes with its
cache expanded): a cache is state the layers write into, and a checkpointed layer's recompute
writes it again (transformers turns the cache off under gradient checkpointing); the attention
function is a pure function of the layer's q, k, v, so gradient checkpointing recomputes it as
is, gradients from every suffix reach the prefix's keys and values (autograd sums them), and peft
LoRA, which wraps only the linear layers, is untouched.

The attention is switched in by `enable` as the model's training attention
(rcgrpo.training.forward.training_attention holds it over forwards AND backwards, so a
checkpointed layer recomputes with it). Called without blocks it is transformers' causal SDPA
without a mask (what the padded path runs on right-padded rows). It replaces SDPA and
flash-attention (packed varlen rows, CUDA) as the update's attention: its kernels are PyTorch's
own, flash on CUDA through SDPA; eager attention is left as it is (docs/shared-prefix.md).

    .venv/bin/pytest tests/test_shared_prefix.py -q
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from rcgrpo.training import suffix_attention
from rcgrpo.training.balance import model_coef
from rcgrpo.training.forward import _identity, _impl, _pick, right_padded
from rcgrpo.training.shared_prefix import pack, share_groups

NAME = "rcgrpo_shared_prefix"  # the attention implementation's registered name


def shared_prefix_attention(module, query, key, value, attention_mask, **kwargs):
    """query (1, h, L, d), key/value (1, h_kv, L, d) of the packed row -> ((1, L, h, d), None).
    kwargs["prefix_blocks"]: [(prefix start, P, [(suffix start, n)])] in packed order, each
    block's suffixes consecutive right after its prefix; without it, transformers' SDPA."""
    blocks = kwargs.pop("prefix_blocks", None)
    if blocks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if kwargs.get("dropout") or kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise ValueError("the shared-prefix attention takes no dropout, sliding window or softcap")
    return suffix_attention.packed(query, key, value, blocks, kwargs.get("scaling")), None


# no mask function registered with it: transformers then builds no (L, L) mask (the blocks are
# the mask), and a forward without blocks gets none either (causal SDPA: right-padded rows only)
AttentionInterface.register(NAME, shared_prefix_attention)


def enable(model, on: bool = True) -> bool:
    """Make the shared-prefix attention the model's training attention where that is SDPA or
    flash-attention (its kernels are PyTorch's own, flash on CUDA); returns whether the model's
    update forwards now share prefixes. on=False restores the one it replaced."""
    current = getattr(model, "training_attention", None) or _impl(model)
    if current != NAME and current != "sdpa" and "flash" not in current:
        return False  # eager and others: not shared
    if current != NAME:
        model.unshared_attention = current
    model.training_attention = NAME if on else getattr(model, "unshared_attention", "sdpa")
    return on


def active(model) -> bool:
    """Whether the model runs the shared-prefix attention now (inside training_attention)."""
    return _impl(model) == NAME


def shared_hidden(model, ids: torch.Tensor, attn: torch.Tensor, targets: torch.Tensor):
    """As rcgrpo.training.forward.masked_hidden, through the packed shared-prefix row: (hidden
    (N, d), where (B, T-1), head). ids, attn (B, T) right-padded; targets (B, T-1)."""
    if not right_padded(attn):
        raise ValueError("the shared-prefix forward takes right-padded rows (attention 1s then 0s)")
    where = targets.bool()
    lengths = attn.sum(1).tolist()
    rows = [ids[i, :n].tolist() for i, n in enumerate(lengths)]
    packed = pack(rows, share_groups(rows, model_coef(model)), ids.shape[1])
    kwargs = {
        "input_ids": packed.ids[None].to(ids.device),  # (1, L)
        "position_ids": packed.positions[None].to(ids.device),  # (1, L)
        "use_cache": False,
        "prefix_blocks": packed.blocks,
    }
    index = packed.index.to(ids.device)
    if getattr(model.config, "final_logit_softcapping", None):  # a head with extra math: full
        return _pick(model(**kwargs).logits, index, where), where, _identity
    hidden = model.get_decoder()(**kwargs).last_hidden_state  # (1, L, d)
    return _pick(hidden, index, where), where, model.get_output_embeddings()
