"""Position range of a pretrained model vs the episode budget: YaRN rope scaling when it is short.

The 7B profiles' episode budget (rcgrpo.models.profiles.PROFILES, sized from the longest ground-truth
episodes of long_context tasks) is 81,920 + 1,536 tokens, but Qwen2.5-7B-Instruct was trained
on 32,768 positions. Past them a plain-RoPE model sees rotation angles it never saw and degrades
without an error. Qwen's model card extends it with YaRN ("rope_scaling": {"type": "yarn",
"factor": 4.0, "original_max_position_embeddings": 32768}); `extend_positions` sets exactly
that kind of entry on the config *before* the weights are loaded, with the smallest factor that
covers the budget (needed / native, e.g. 83,456 / 32,768 = 2.55; a larger factor compresses
short contexts more). The same config.json goes to vLLM through export_for_serving, so the
rollout engine and the trainer compute the same positions.

Applied only to the pretrained profiles (hub and GGUF ones, their weights from the hub or a
model.path folder): the tiny and qwen-shape profiles are built here from random weights and
trained at whatever length they meet, so their plain RoPE is what they learn (their default
run is unchanged), whatever folder they load. A model already scaled (Llama
3.1's "llama3" rope, 131,072 positions) or long enough is left as it is.

    from rcgrpo.models.long_context import extend_positions
    factor = extend_positions(config, needed=83_456)   # None: nothing to do
"""

from __future__ import annotations

import math
import warnings


def extend_positions(config, needed: int) -> float | None:
    """Give `config` (a transformers PretrainedConfig, changed in place) YaRN rope scaling
    covering `needed` positions if its own range is shorter; returns the factor, or None when
    nothing was changed."""
    native = int(getattr(config, "max_position_embeddings", 0) or 0)
    params = getattr(config, "rope_parameters", None)
    if not native or needed <= native or not isinstance(params, dict):
        return None
    if params.get("rope_type", "default") != "default":  # scaled already, but not far enough
        warnings.warn(
            f"the model has {native} positions ({params.get('rope_type')} rope) and the episode "
            f"budget needs {needed}: lower rollout.max_total_tokens or extend its rope yourself",
            stacklevel=2,
        )
        return None
    factor = math.ceil(needed / native * 1000) / 1000  # covers `needed`, 3 decimals
    config.rope_parameters = {
        **params,
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": native,
    }
    config.max_position_embeddings = needed
    return factor
