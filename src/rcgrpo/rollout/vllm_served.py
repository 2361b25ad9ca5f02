"""What a vLLM server serves, made checkable: the LoRA adapter named by its contents, and the
log-probs the server gives a fixed sequence under that name (the sync probe's engine side).

Why a content hash in the name: vLLM keeps what it derived from an adapter (its LoRA slot, the
prefix cache of requests made under it) by name, and an adapter reloaded under a name it already
served can keep answering from the old weights' cache (the field's silent-desync reports). The
name `policy-v<version>-<32 hex of the sha256 of the exported files>` never names two contents,
and says which weights a request ran on.

    .venv/bin/pytest tests/test_sync_probe.py -q
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def adapter_name(version: int, folder: Path) -> str:
    """`policy-v<version>-<content hash>` of an exported adapter folder (its files' names and
    bytes, in name order)."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).iterdir()):
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes())
    return f"policy-v{version}-{h.hexdigest()[:32]}"


def prompt_logprobs(server, model: str, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t = 1 .. n-1 as `server` computes them under `model` (an
    adapter's name or the base), at temperature 1 (vLLM's raw prompt log-probs; it reads no
    prefix cache for them)."""
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
    body["prompt_logprobs"] = 0  # the prompt token's own log-prob at each position
    per_position = server.post("/v1/completions", body)["choices"][0]["prompt_logprobs"]
    # [None, {"<id>": {"logprob": ...}}, ...]: position 0 has no context
    pairs = zip(per_position[1:], ids[1:], strict=True)
    return [float(entry[str(t)]["logprob"]) for entry, t in pairs]
