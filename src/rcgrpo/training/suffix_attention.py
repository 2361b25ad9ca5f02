"""The attention of the shared-prefix forward: a cluster's prefix attends causally to itself, and
each of its suffixes attends to [prefix; itself] with a bottom-right causal mask (query i of a
suffix of n sees keys 0..P+i), at causal FLOPs and with no (n, P+n) mask built or saved.

Two kernels, chosen by device (`kernel`), both exact (tests/test_shared_prefix.py):
* `merge` (the CPU): the suffix's attention split at the prefix boundary. All of a cluster's
  suffix queries against the prefix's keys, with no mask (every suffix query sees the whole
  prefix), in one call; each suffix against its own keys, causal (square: top-left and
  bottom-right agree). The two partial outputs are merged by their log-sum-exps, as ring and
  flash-decoding attention merge blocks: o = (e^lse_a o_a + e^lse_b o_b) / (e^lse_a + e^lse_b).
  The backward runs the fused kernel's own backward on each part with the MERGED output and
  log-sum-exp: it recomputes the probabilities of the part's keys under the whole softmax, so
  the two parts' gradients are those of the single attention. Needs the log-sum-exp, which
  only PyTorch's fused CPU flash-attention op returns (`torch.ops.aten.
  _scaled_dot_product_flash_attention_for_cpu` and its backward): what `F.scaled_dot_product_
  attention` runs on the CPU. A masked SDPA call there would turn the boolean mask into a
  float32 (n, P+n) tensor and keep it for the backward: 4 bytes per query-key pair, more than
  the rest of the suffix's attention (bench/update.py's peak memory).
* `lower_right` (CUDA and any other device): per suffix, SDPA over [prefix keys; suffix keys]
  with `torch.nn.attention.bias.causal_lower_right`, which dispatches to the flash kernel
  (causal, bottom-right aligned, GQA without repeated K/V) or the memory-efficient one with its
  bottom-right mask type, neither holding a mask; elsewhere it materialises one.

Shapes: q (1, h, n, d), k and v (1, h_kv, n, d) as transformers' attention functions get them.

    .venv/bin/pytest tests/test_shared_prefix.py -q -k kernel
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CPU_BACKWARD = getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None
)


def kernel(device: torch.device | str) -> str:
    """Which suffix kernel runs on `device`: "merge" or "lower_right" (module docstring)."""
    cpu = torch.device(device).type == "cpu"
    return "merge" if cpu and _CPU is not None and _CPU_BACKWARD is not None else "lower_right"


def causal(q, k, v, scale: float | None) -> torch.Tensor:
    """Causal self-attention of one sequence: (1, h, n, d)."""
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)


def suffixes(q, kp, vp, ks, vs, lengths: list[int], scale: float | None) -> torch.Tensor:
    """The consecutive suffixes of one cluster (lengths n_1.., summing to N) attending to
    [prefix; own keys]: q (1, h, N, d), kp/vp (1, h_kv, P, d), ks/vs (1, h_kv, N, d) ->
    (1, h, N, d)."""
    if kernel(q.device) == "merge":
        return _Merged.apply(q, kp, vp, ks, vs, tuple(lengths), scale)
    gqa = q.shape[1] != kp.shape[1]
    parts, s = [], 0
    for n in lengths:
        keys = torch.cat([kp, ks[:, :, s : s + n]], 2)  # (1, h_kv, P+n, d)
        values = torch.cat([vp, vs[:, :, s : s + n]], 2)
        bias = causal_lower_right(n, kp.shape[2] + n)
        out = F.scaled_dot_product_attention(
            q[:, :, s : s + n], keys, values, attn_mask=bias, scale=scale, enable_gqa=gqa
        )
        parts.append(out)
        s += n
    return torch.cat(parts, 2)


def _blocks(lengths):
    s = 0
    for n in lengths:
        yield slice(s, s + n)
        s += n


class _Merged(torch.autograd.Function):
    """The `merge` kernel (module docstring) for the fused CPU op; exact in value and gradient."""

    @staticmethod
    def forward(ctx, q, kp, vp, ks, vs, lengths, scale):
        out_a, lse_a = _CPU(q, kp, vp, 0.0, False, scale=scale)  # (1, h, N, d), (1, h, N)
        out_b, lse_b = [], []
        for sl in _blocks(lengths):
            o, lse = _CPU(q[:, :, sl], ks[:, :, sl], vs[:, :, sl], 0.0, True, scale=scale)
            out_b.append(o)
            lse_b.append(lse)
        out_b, lse_b = torch.cat(out_b, 2), torch.cat(lse_b, 2)
        lse = torch.logaddexp(lse_a, lse_b)  # (1, h, N): the whole softmax's normaliser
        out = torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[..., None] * out_b
        out = out.to(q.dtype)
        ctx.save_for_backward(q, kp, vp, ks, vs, out, lse)
        ctx.lengths, ctx.scale = lengths, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, kp, vp, ks, vs, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        dq, dkp, dvp = _CPU_BACKWARD(grad, q, kp, vp, out, lse, 0.0, False, scale=ctx.scale)
        dqs, dks, dvs = [], [], []
        for sl in _blocks(ctx.lengths):
            parts = _CPU_BACKWARD(
                grad[:, :, sl],
                q[:, :, sl],
                ks[:, :, sl],
                vs[:, :, sl],
                out[:, :, sl],
                lse[:, :, sl],
                0.0,
                True,
                scale=ctx.scale,
            )
            for acc, part in zip((dqs, dks, dvs), parts, strict=True):
                acc.append(part)
        dq = dq + torch.cat(dqs, 2)
        return dq, dkp, dvp, torch.cat(dks, 2), torch.cat(dvs, 2), None, None
