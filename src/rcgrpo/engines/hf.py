"""The transformers rollout engine: batched sampling with left padding and a KV cache.

One `generate` call continues B prompts by one message each: a single prefill of the left-padded
batch (B, L), then one decode step per new token over the rows still running, reusing the KV
cache. A row stops at the stop token or at its own max_new; finished rows are dropped from the
batch (and the cache) so the per-step cost follows the rows still generating. Sampling is done
per row with a torch.Generator seeded from (seed, episode, step): a row's draws do not depend on
its batch mates. The log-prob kept per token is log softmax(logits) at temperature 1, which is
what a training forward pass over the same ids recomputes (checked in tests/test_engines.py).

    .venv/bin/pytest tests/test_engines.py -q
"""

from __future__ import annotations

import torch

from rcgrpo.engines.base import Engine, RolloutConfig, Sample


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generators: list[torch.Generator]
) -> torch.Tensor:
    """Next token per row from logits (B, V): greedy at temperature 0, else nucleus sampling.
    Returns (B,) ids."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (B, V)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the top token always stays)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.stack(
        [torch.multinomial(probs[i], 1, generator=g)[0] for i, g in enumerate(generators)]
    )


class HFEngine(Engine):
    """Batched generation straight from the policy's model object (no copy: `sync` is free)."""

    def __init__(self, cfg: RolloutConfig, policy):
        super().__init__(cfg, policy)
        self.pad_id = policy.tokenizer.pad_token_id

    def sync(self, policy) -> None:
        # The engine holds a reference to the trained model, so updated weights are served at
        # once; a different Policy object (e.g. reloaded from disk) replaces it.
        self.policy = policy

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], max_new: list[int], seeds: list[int]
    ) -> list[Sample]:
        from transformers import DynamicCache

        model = self.policy.model
        was_training = model.training
        model.eval()  # no dropout while sampling
        device = next(model.parameters()).device
        try:
            return self._generate(model, device, prompts, max_new, seeds, DynamicCache)
        finally:
            model.train(was_training)

    def _generate(self, model, device, prompts, max_new, seeds, cache_cls) -> list[Sample]:
        B, L = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's last token is at L-1
            ids[i, L - len(p) :] = torch.tensor(p)
            attn[i, L - len(p) :] = 1
        ids, attn = ids.to(device), attn.to(device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, L) positions ignore the padding
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        cache = cache_cls(config=model.config)
        out = model(
            input_ids=ids, attention_mask=attn, position_ids=pos,
            cache=cache, use_cache=True, logits_to_keep=1,
        )  # fmt: skip
        logits = out.logits[:, -1].float().cpu()  # (B, V)
        live = list(range(B))  # row of the running batch -> index into prompts
        next_pos = pos[:, -1:] + 1  # (B, 1)
        samples = [Sample([], []) for _ in range(B)]
        stop = self.policy.stop_id
        while True:
            tok = sample_next(logits, self.cfg.temperature, self.cfg.top_p, [gens[i] for i in live])
            logp = torch.log_softmax(logits, dim=-1).gather(-1, tok[:, None])[:, 0]  # (b,)
            keep = []
            for row, i in enumerate(live):
                samples[i].ids.append(int(tok[row]))
                samples[i].logprobs.append(float(logp[row]))
                if int(tok[row]) != stop and len(samples[i].ids) < max_new[i]:
                    keep.append(row)
            if not keep:
                return samples
            if len(keep) < len(live):  # drop finished rows from the batch and the KV cache
                index = torch.tensor(keep, device=device)
                cache.batch_select_indices(index)
                attn, next_pos, tok = attn[index], next_pos[index], tok[keep]
                live = [live[r] for r in keep]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)  # (b, T+1)
            out = model(
                input_ids=tok[:, None].to(device), attention_mask=attn, position_ids=next_pos,
                cache=cache, use_cache=True,
            )  # fmt: skip
            logits = out.logits[:, -1].float().cpu()
            next_pos = next_pos + 1
