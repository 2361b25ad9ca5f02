"""The training forward pass: next-token logits only at the positions a loss reads.

A causal LM's forward computes logits at every position, (B, T, V), but SFT and RL losses read
only the positions that predict a trained token (assistant tokens: ~2-10 % of a tool-calling
sequence, whose prompt is mostly tool docs). `masked_logits` runs the decoder over the whole
sequence, then the LM head on those positions only, (N, V): on the tiny profile a training step
takes about half the time, and on a 7B model (V = 152k) it avoids a (B, T, V) float32 tensor of
GBs. Values equal the full forward's (same modules, same order), checked in tests/test_sft.py.

How a right-padded micro-batch (B, T) reaches the decoder depends on the model's attention
implementation (chosen per device at load, rcgrpo.models.device.attention_implementation, and
switched on for the updates by `training_attention`):
* flash-attention (`packs(model)`): packed, padding-free. The B sequences are concatenated into
  one row (1, L) with position ids restarting at 0 for each; transformers then calls
  flash_attn_varlen_func with the sequences' boundaries. No padding is computed at all.
* SDPA / eager: the rows as they are, with NO attention mask. Under a causal mask a real token
  only attends to earlier positions, and right padding lies after every real token, so the mask
  changes nothing a loss reads; without it SDPA runs its causal kernels instead of building a
  dense (B, 1, T, T) mask (8 GB for 8 x 32k). Left-padded input keeps its mask.
Either way the N selected rows come in the same (row, position) order as the padded layout's
`where`, so callers see the same (N, V) tensor (tests/test_batching.py checks both layouts
against the masked padded forward).

    .venv/bin/pytest tests/test_sft.py tests/test_batching.py -q -k "masked or layout"
"""

from __future__ import annotations

import contextlib
import functools

import torch


def _impl(model) -> str:
    return getattr(getattr(model, "config", None), "_attn_implementation", None) or ""


def packs(model) -> bool:
    """Whether this model's training forwards pack a micro-batch into one row (flash-attention
    varlen): the attention it trains with (`model.training_attention`), else its current one."""
    return "flash" in (getattr(model, "training_attention", None) or _impl(model))


def with_training_attention(fn):
    """Decorator: fn(model, ...) runs under `training_attention(model)`."""

    @functools.wraps(fn)
    def wrapped(model, *args, **kwargs):
        with training_attention(model):
            return fn(model, *args, **kwargs)

    return wrapped


@contextlib.contextmanager
def training_attention(model):
    """Run the block with the attention the model trains with (`model.training_attention`, set
    by rcgrpo.models.loading: flash-attention where chosen), then switch back to the one it was
    loaded with (sdpa: the transformers engine's decode passes 4D masks flash cannot take).
    Hold it over forwards AND backwards: a checkpointed layer recomputes in backward with the
    implementation set then, and packed rows under SDPA without a mask would mix sequences.
    On a 16-bit base with float32 adapters the block also runs LoRA in 16-bit
    (rcgrpo.models.lora.lora_compute)."""
    from rcgrpo.models.lora import lora_compute

    want, have = getattr(model, "training_attention", None), _impl(model)
    if not want or want == have:
        with lora_compute(model):  # bf16 LoRA compute on a bf16 base (float32 master weights)
            yield
        return
    model.set_attn_implementation(want)
    try:
        with lora_compute(model):
            yield
    finally:
        model.set_attn_implementation(have)


def right_padded(attn: torch.Tensor) -> bool:
    """Every row of attn (B, T) is ones then zeros (padding only on the right)."""
    n = attn.sum(1, keepdim=True)  # (B, 1) real tokens per row
    return bool((attn.bool() == (torch.arange(attn.shape[1], device=attn.device) < n)).all())


def decoder_inputs(model, ids: torch.Tensor, attn: torch.Tensor):
    """(kwargs for the decoder, index (B, T) of each padded position in the packed row or None).

    ids, attn: (B, T) right-padded. Packed: input_ids and position_ids (1, L), L = attn.sum().
    The layout follows the attention the model runs now (flash: packed)."""
    if "flash" in _impl(model) and right_padded(attn):
        keep = attn.bool()
        lengths = attn.sum(1).tolist()
        pos = torch.cat([torch.arange(n, device=ids.device) for n in lengths])[None]  # (1, L)
        index = torch.full(ids.shape, -1, dtype=torch.long, device=ids.device)
        index[keep] = torch.arange(int(keep.sum()), device=ids.device)
        return {"input_ids": ids[keep][None], "position_ids": pos}, index
    if right_padded(attn):
        return {"input_ids": ids}, None
    return {"input_ids": ids, "attention_mask": attn}, None


def _pick(values: torch.Tensor, index, where: torch.Tensor) -> torch.Tensor:
    """Rows of values (B, T, ...) or packed (1, L, ...) at the positions predicting a target:
    where (B, T-1) -> (N, ...), in the padded layout's row-major order."""
    if index is None:
        return values[:, :-1][where]
    return values[0][index[:, :-1][where]]


def masked_hidden(model, ids: torch.Tensor, attn: torch.Tensor, targets: torch.Tensor):
    """(hidden (N, d), where (B, T-1) bool, head): the decoder's output at the N positions
    predicting a trained token, and the module that turns it into logits (the LM head). A model
    whose head has extra math (final_logit_softcapping) runs whole: hidden is then its logits
    (N, V) and head the identity. ids, attn (B, T); targets (B, T-1) aligned with ids[:, 1:].
    No KV cache is built (use_cache=False: an eval-mode forward would otherwise keep every
    layer's keys and values until it returns)."""
    where = targets.bool()
    kwargs, index = decoder_inputs(model, ids, attn)
    if getattr(model.config, "final_logit_softcapping", None):  # a head with extra math: full
        return _pick(model(**kwargs, use_cache=False).logits, index, where), where, _identity
    hidden = model.get_decoder()(**kwargs, use_cache=False).last_hidden_state  # (B|1, T|L, d)
    return _pick(hidden, index, where), where, model.get_output_embeddings()


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def masked_logits(model, ids: torch.Tensor, attn: torch.Tensor, targets: torch.Tensor):
    """Logits predicting ids[:, 1:] where `targets` is set.

    ids, attn: (B, T); targets: (B, T-1), aligned with ids[:, 1:] (1 = a trained token).
    Returns (logits (N, V), where (B, T-1) bool), N = where.sum(): row n of logits predicts
    ids[:, 1:][where][n] from its prefix. Works for transformers causal LMs and peft models
    around them (LoRA is applied inside the decoder)."""
    hidden, where, head = masked_hidden(model, ids, attn, targets)
    return head(hidden), where  # (N, V)


def scatter(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """(N,) values at the positions of `where` (B, T-1) -> (B, T-1), zeros elsewhere."""
    out = torch.zeros(where.shape, dtype=values.dtype, device=values.device)
    out[where] = values
    return out
