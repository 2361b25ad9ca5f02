"""Measure one full-width decoder layer of a profile, built as the trainer builds it on CUDA:
the bytes autograd saves per token, and the peak of its forward + backward per token (what a
checkpointed layer holds while it recomputes and back-propagates).

The layer: transformers' own decoder layer of the profile's architecture (a one-layer model
from its config), in the dtype `model.dtype: auto` gives on CUDA, SDPA attention (its causal
kernels keep no T x T matrix, as flash-attention), LoRA from rcgrpo.models.lora.apply_lora at
rank LORA_R, run under rcgrpo.models.lora.lora_compute (what the trainers' forwards run
under). Counted on the CPU, without a GPU: saved bytes with
`torch.autograd.graph.saved_tensors_hooks` (weights and the layer's input excluded: the plan
counts those itself), the peak by following every tensor an op creates until it is freed
(a TorchDispatchMode). Both at two token counts; the plan takes the slope (bytes per token),
so nothing constant (LoRA gradients, autocast's weight copies) is spread over the tokens.
`shared=True` measures the same layer under the shared-prefix attention
(rcgrpo.training.shared_forward) on a packed row (a prefix of half the tokens, then SUFFIXES
suffixes): bytes per computed token of `rl.shared_prefix`'s update, with the suffix kernel of
the CPU (rcgrpo.training.suffix_attention: `merge`; CUDA's `lower_right` also keeps a copy of the
prefix's keys and values per suffix, which the plan adds by its size).

    rcgrpo plan --measure                        # every profile -> training/plan/layers.json
    .venv/bin/pytest tests/test_plan.py -q -k measure
"""

from __future__ import annotations

import datetime
import json
import weakref
from pathlib import Path

LAYERS_FILE = Path(__file__).with_name("layers.json")
COMMAND = "rcgrpo plan --measure"
TOKENS = (32, 64)  # two token counts: the per-token figures are the slope between them
LORA_R = 16
PROFILES = ("qwen-shape", "tiny", "qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "smollm2-135m")
SUFFIXES = 4  # shared=True: a packed row of a prefix (half the tokens) and 4 suffixes


def cuda_dtype(profile: str) -> str:
    """What `model.dtype: auto` resolves to on CUDA (rcgrpo.models.device.resolve)."""
    from rcgrpo.models.profiles import PROFILES as ALL

    return "bfloat16" if ALL[profile].source in ("hub", "gguf") else "float32"


def layer_config(profile: str):
    """A transformers config of one decoder layer of the profile (a 256-row vocabulary: the
    embedding is not part of the layer)."""
    from transformers import LlamaConfig, Qwen2Config

    from rcgrpo.training.plan.constants import architecture

    a = architecture(profile)
    qwen = a.qkv_bias
    cls = Qwen2Config if qwen else LlamaConfig
    return cls(
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=1,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim,
        vocab_size=256,
        tie_word_embeddings=False,
    )


class _Live:
    """A TorchDispatchMode that adds up the bytes of every storage an op creates while it is
    alive, and keeps the peak (CPU tensors: the CUDA allocator's figure without its slack)."""

    def __new__(cls, skip: set[int]):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        class Live(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.live, self.peak, self.refs = 0, 0, {}
                self.skip = skip  # storages that exist before (weights and their views, inputs)

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if hasattr(t, "untyped_storage"):
                        self._track(t.untyped_storage())
                return out

            def _track(self, st):
                key, n = st.data_ptr(), st.nbytes()
                if key in self.refs or key in self.skip or n == 0:
                    return
                self.live += n
                self.peak = max(self.peak, self.live)

                def gone(_, key=key, n=n):
                    self.live -= n
                    self.refs.pop(key, None)

                self.refs[key] = weakref.ref(st, gone)

        return Live()


def build_layer(profile: str, fp32_adapters: bool = False):
    """(one-layer peft model, its decoder, a factory of the compute context): the profile's layer in
    its CUDA dtype with LoRA. fp32_adapters: peft's default path instead (LoRA inputs cast to
    float32, no autocast), for comparison."""
    import contextlib

    import torch
    from transformers import AutoModelForCausalLM

    from rcgrpo.models.lora import apply_lora, lora_compute
    from rcgrpo.models.profiles import ModelConfig

    torch.manual_seed(0)
    dtype = getattr(torch, cuda_dtype(profile))
    model = AutoModelForCausalLM.from_config(
        layer_config(profile), dtype=dtype, attn_implementation="sdpa"
    )
    lora = ModelConfig(profile=profile, lora_r=LORA_R, train_reward_rows=False)
    model = apply_lora(model, lora, [])

    def compute():
        return contextlib.nullcontext() if fp32_adapters else lora_compute(model)

    return model, model.get_base_model().model, compute


def packed_row(tokens: int) -> tuple[list[int], list]:
    """Positions and blocks (rcgrpo.training.shared_prefix.pack's) of a packed row of `tokens`:
    a prefix of tokens // 2, then SUFFIXES suffixes sharing the rest."""
    p = tokens // 2
    n = (tokens - p) // SUFFIXES
    lengths = [n] * (SUFFIXES - 1) + [tokens - p - n * (SUFFIXES - 1)]
    starts = [p + sum(lengths[:i]) for i in range(SUFFIXES)]
    positions = list(range(p)) + [p + j for m in lengths for j in range(m)]
    return positions, [(0, p, list(zip(starts, lengths, strict=True)))]


def measure_layer(model, inner, compute, tokens: int, shared: bool = False) -> dict:
    """{"saved": bytes autograd keeps, "peak": peak bytes of forward + backward} of the first
    decoder layer of `inner` (the peft model's decoder) over `tokens` tokens (shared: a packed
    row of the shared-prefix forward, `packed_row`)."""
    import torch

    from rcgrpo.training import shared_forward

    dtype = inner.layers[0].input_layernorm.weight.dtype
    x = torch.randn(1, tokens, inner.config.hidden_size, dtype=dtype, requires_grad=True)
    pos = torch.arange(tokens)[None]
    extra = {}
    if shared:
        positions, blocks = packed_row(tokens)
        pos, extra = torch.tensor(positions)[None], {"prefix_blocks": blocks}
        model.set_attn_implementation(shared_forward.NAME)
    with torch.no_grad():
        pe = inner.rotary_emb(x, pos)
    grad = torch.randn_like(x)
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {t.untyped_storage().data_ptr() for t in (x, *pe, grad)}
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            saved[st.data_ptr()] = st.nbytes()
        return t

    with compute(), _Live(skip) as live:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = inner.layers[0](
                x, attention_mask=None, position_ids=pos, position_embeddings=pe, **extra
            )
        out = out[0] if isinstance(out, tuple) else out
        out.backward(grad)
        del out
    model.zero_grad(set_to_none=True)
    model.set_attn_implementation("sdpa")
    return {"saved": sum(saved.values()), "peak": live.peak}


def per_token(profile: str, fp32_adapters: bool = False, shared: bool = False) -> dict:
    """Bytes per (computed) token: saved, peak, and the backward's transient (peak - saved)."""
    model, inner, compute = build_layer(profile, fp32_adapters)
    lo, hi = (measure_layer(model, inner, compute, t, shared) for t in TOKENS)
    span = TOKENS[1] - TOKENS[0]
    saved, peak = (hi["saved"] - lo["saved"]) / span, (hi["peak"] - lo["peak"]) / span
    return {"saved": round(saved, 1), "peak": round(peak, 1), "transient": round(peak - saved, 1)}


def measure_all(profiles=PROFILES, merge: bool = False) -> dict:
    """Measure each profile's layer; the record `rcgrpo plan --measure` writes (merge: keep the
    recorded layers of the other profiles)."""
    import peft
    import torch
    import transformers

    record = {
        "command": COMMAND,
        "date": datetime.date.today().isoformat(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
        },
        "tokens": list(TOKENS),
        "lora_r": LORA_R,
        "build": "one decoder layer, model.dtype auto as on CUDA, SDPA, LoRA on the profile's "
        "targets, bf16 LoRA compute with float32 master weights (models/lora.lora_compute)",
        "layers": recorded()["layers"] if merge and LAYERS_FILE.exists() else {},
    }
    for p in profiles:
        entry = {"dtype": cuda_dtype(p), **per_token(p)}
        if entry["dtype"] != "float32":
            entry["fp32_adapters_saved"] = per_token(p, fp32_adapters=True)["saved"]
        shared = per_token(p, shared=True)  # rl.shared_prefix's packed row
        entry["shared_saved"], entry["shared_peak"] = shared["saved"], shared["peak"]
        record["layers"][p] = entry
    return record


def write(record: dict, path: Path = LAYERS_FILE) -> Path:
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def recorded(path: Path = LAYERS_FILE) -> dict:
    return json.loads(path.read_text())
