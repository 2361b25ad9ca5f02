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


def packed(query, key, value, blocks, scale: float | None) -> torch.Tensor:
    """The attention of a packed row: query (1, h, L, d), key/value (1, h_kv, L, d), blocks
    [(prefix start, P, [(suffix start, n)])] (rcgrpo.training.shared_prefix.pack, each block's
    suffixes right after its prefix) -> (1, L, h, d), what transformers' o_proj reads."""
    if kernel(query.device) == "merge":
        return _Merged.apply(query, key, value, tuple(_spans(blocks)), scale)
    gqa = query.shape[1] != key.shape[1]
    parts = []
    for start, p, suffixes in blocks:
        pre = slice(start, start + p)
        kp, vp = key[:, :, pre], value[:, :, pre]  # (1, h_kv, P, d): read by every suffix
        parts.append(
            F.scaled_dot_product_attention(
                query[:, :, pre], kp, vp, is_causal=True, scale=scale, enable_gqa=gqa
            )
        )
        for s, n in suffixes:
            keys = torch.cat([kp, key[:, :, s : s + n]], 2)  # (1, h_kv, P+n, d)
            values = torch.cat([vp, value[:, :, s : s + n]], 2)
            bias = causal_lower_right(n, p + n)
            out = F.scaled_dot_product_attention(
                query[:, :, s : s + n], keys, values, attn_mask=bias, scale=scale, enable_gqa=gqa
            )
            parts.append(out)
    return torch.cat(parts, 2).transpose(1, 2).contiguous()


def _spans(blocks):
    """Per block: (prefix slice, the suffixes' slice, [each suffix's slice])."""
    for start, p, suffixes in blocks:
        pre = slice(start, start + p)
        own = tuple(slice(s, s + n) for s, n in suffixes)
        yield pre, slice(start + p, own[-1].stop if own else start + p), own


def _heads(t: torch.Tensor, rows: slice) -> torch.Tensor:
    """Rows of a (1, L, h, d) buffer as the fused op's (1, h, n, d) view."""
    return t[:, rows].transpose(1, 2)


class _Merged(torch.autograd.Function):
    """The `merge` kernel (module docstring) over a whole packed row, for the fused CPU op:
    exact in value and gradient. Its output is one (1, L, h, d) buffer, the tensor it keeps for
    the backward and the one o_proj reads, so it holds per token what the causal kernel holds
    (q, k, v, output, log-sum-exp)."""

    @staticmethod
    def forward(ctx, q, k, v, spans, scale):
        out = q.new_empty(q.shape[0], q.shape[2], q.shape[1], q.shape[3])  # (1, L, h, d)
        lse = q.new_empty(q.shape[:3], dtype=torch.float32)  # (1, h, L)
        for pre, suf, own in spans:
            o, lse[:, :, pre] = _CPU(
                q[:, :, pre], k[:, :, pre], v[:, :, pre], 0.0, True, scale=scale
            )
            _heads(out, pre).copy_(o)
            if suf.stop == suf.start:
                continue
            # all suffix queries against the prefix (no mask), each suffix against itself
            out_a, lse_a = _CPU(q[:, :, suf], k[:, :, pre], v[:, :, pre], 0.0, False, scale=scale)
            for rows in own:
                out_b, lse_b = _CPU(
                    q[:, :, rows], k[:, :, rows], v[:, :, rows], 0.0, True, scale=scale
                )
                at = slice(rows.start - suf.start, rows.stop - suf.start)  # in the suffix span
                both = torch.logaddexp(lse_a[:, :, at], lse_b)  # (1, h, n): the whole softmax
                merged = torch.exp(lse_a[:, :, at] - both)[..., None] * out_a[:, :, at]
                merged += torch.exp(lse_b - both)[..., None] * out_b
                _heads(out, rows).copy_(merged)
                lse[:, :, rows] = both
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spans, ctx.scale = spans, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        scale = ctx.scale

        def back(rows, keys, causal: bool):  # the fused backward at the merged out and lse
            parts = _CPU_BACKWARD(
                _heads(grad, rows).contiguous(),
                q[:, :, rows],
                k[:, :, keys],
                v[:, :, keys],
                _heads(out, rows),
                lse[:, :, rows],
                0.0,
                causal,
                scale=scale,
            )
            dq[:, :, rows] += parts[0]
            dk[:, :, keys] += parts[1]
            dv[:, :, keys] += parts[2]

        for pre, suf, own in ctx.spans:
            back(pre, pre, True)
            if suf.stop > suf.start:
                back(suf, pre, False)
                for rows in own:
                    back(rows, rows, True)
        return dq, dk, dv, None, None
