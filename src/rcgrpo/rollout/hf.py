"""The transformers rollout engine: batched sampling into a preallocated KV cache.

One `generate` call continues B prompts by one message each (times: 32 BFCL prompts of 465..1108
tokens, tiny profile, 1 thread, shared 2-core box):

1. Prefill without padding, and only of what is new. Inside `rollout` an episode's K/V is kept
   after each message (`PrefixStore`), so its next prompt prefills only the sampled-id tail and
   the new user turn or observations (bfcl protocol bench: 21% of the prompt tokens). The rest
   is prefilled with plain causal attention, rows of equal length together, others alone, and
   copied left-padded into one static cache of T = L + N slots per row (L = longest prompt,
   N = most new tokens). One padded (B, L) forward instead cost 2.8x (1.59 s vs 0.56 s): padding
   adds quadratic attention work, a masked attention kernel and repeated GQA heads, while the
   unpadded rows already run at the matmul rate.
2. Decode: one forward of the running rows per new token, reading and writing the static cache
   with a (b, 1, 1, T) boolean mask kept here (one column switched on per step), so no cache is
   concatenated and no mask is rebuilt per step (a growing DynamicCache copied ~6 ms of K/V per
   step at B=32, a third of the step). One host sync per step (how many rows still run).
3. Finished rows keep running (their tokens are ignored) until a quarter of the rows are done;
   only then are they cut from the cache, so the cache is copied a few times, not once per row.

Sampling is seeded per row: one torch.Generator per (seed, episode, step) draws the row's N
uniforms up front, and token t is the inverse CDF of that row's distribution at uniform t: all
rows in one vectorised draw instead of a torch.multinomial per row. A row's ids depend on its own
seed and logits only, never on its batch mates. The log-prob kept per token is
log softmax(logits)[id] at temperature 1 (logit - logsumexp), which is what a training forward
pass over the same ids recomputes (tests/test_engines.py checks all of this). Torch runs with
`rcgrpo.runtime.torch_threads(cfg.threads)` threads while generating (see there why).

    .venv/bin/pytest tests/test_engines.py -q
"""

from __future__ import annotations

import contextlib

import torch

from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.engine import Engine, Sample
from rcgrpo.runtime import torch_threads

PREFILL_TOKENS = 8192  # most prompt tokens in one prefill forward (rows of equal length)


def uniforms(seeds: list[int], n: int) -> torch.Tensor:
    """(B, n) float32 in [0, 1): row i is the first n draws of torch.Generator(seeds[i])."""
    return torch.stack([torch.rand(n, generator=torch.Generator().manual_seed(s)) for s in seeds])


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor
) -> torch.Tensor:
    """Next token per row from logits (B, V) and one uniform per row u (B,): greedy at
    temperature 0, else the inverse CDF of the (nucleus-truncated) softmax at u. Returns (B,)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (B, V)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the top token always stays)
        probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p, 0.0)
    cdf = probs.cumsum(-1)  # (B, V), unnormalised: the last column is the kept mass
    mass = cdf[:, -1:]  # (B, 1)
    # target strictly below the mass (u * mass can round up to it), so the first index whose
    # cdf exceeds it exists and has p > 0: a zero-mass token is never picked
    target = torch.minimum(u.to(cdf)[:, None] * mass, torch.nextafter(mass, torch.zeros_like(mass)))
    tok = torch.searchsorted(cdf, target, right=True)[:, 0]  # (B,)
    return tok if order is None else order.gather(-1, tok[:, None])[:, 0]


def token_logprob(logits: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[tok] at temperature 1, (B, V), (B,) -> (B,): no (B, V) log-softmax."""
    logits = logits.float()
    return logits.gather(-1, tok[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def prefill_groups(lengths: list[int], max_tokens: int = PREFILL_TOKENS) -> list[list[int]]:
    """Row indices grouped by equal prompt length, each group at most max_tokens tokens."""
    by_len: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    groups = []
    for n, rows in by_len.items():
        step = max(1, max_tokens // max(n, 1))
        groups += [rows[k : k + step] for k in range(0, len(rows), step)]
    return groups


class PrefixStore:
    """K/V of the sequences generated so far in one rollout, found again by their ids.

    A message's next prompt is its episode's last prompt + the sampled ids + the observation or
    user-turn ids, so only that suffix needs a prefill. Each entry (one per episode in flight:
    a hit removes it, and so does the episode's end) holds per layer (1, kv heads, n, head dim)
    keys and values."""

    def __init__(self):
        self.by_len: dict[int, list[tuple[list[int], list]]] = {}

    def put(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.by_len.setdefault(len(ids), []).append((ids, kv))

    def take(self, prompt: list[int]) -> tuple[int, list] | None:
        """(n, kv) of the longest stored proper prefix of prompt, or None."""
        for n in sorted((n for n in self.by_len if n < len(prompt)), reverse=True):
            entries = self.by_len[n]
            for j, (ids, kv) in enumerate(entries):
                if ids[-1] == prompt[n - 1] and ids == prompt[:n]:
                    del entries[j]
                    return n, kv
        return None


def cache_kwarg(model) -> str:
    """The forward's name for the K/V cache: `cache` (transformers >= 5.2x, where
    `past_key_values` is deprecated) or `past_key_values` (5.17, the lent GPU box's, where an
    unknown `cache=` was silently ignored and the prefill kept no K/V)."""
    import inspect

    params = inspect.signature(model.get_decoder().forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HFEngine(Engine):
    """Batched generation straight from the policy's model object (no copy: `sync` is free)."""

    def __init__(self, cfg: RolloutConfig, policy):
        super().__init__(cfg, policy)
        self.pad_id = policy.tokenizer.pad_token_id
        self.prefixes: PrefixStore | None = None  # set only while `rollout` runs

    def sync(self, policy) -> None:
        # The engine holds a reference to the trained model, so updated weights are served at
        # once; a different Policy object (e.g. reloaded from disk) replaces it.
        self.policy = policy

    @torch.no_grad()
    def score(self, ids: list[int]) -> list[list[float]]:
        """Engine.score: one forward of the model it samples from (one replica)."""
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            x = torch.tensor([ids], device=next(model.parameters()).device)
            logits = model(input_ids=x).logits[0, :-1].float()  # (n-1, V)
        finally:
            model.train(was_training)
        return [token_logprob(logits, x[0, 1:]).tolist()]

    def rollout(self, *args, **kwargs):
        # K/V are reused only inside one rollout: the weights cannot change there, while between
        # rollouts an optimizer step updates this very model in place (stale K/V, silently).
        self.prefixes = PrefixStore() if self.cfg.prefix_cache else None
        try:
            return super().rollout(*args, **kwargs)
        finally:
            self.prefixes = None

    def finished(self, ids: list[int], episode: int | None = None) -> None:
        if self.prefixes is not None:  # its K/V will not be asked for again
            self.prefixes.take(ids)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], max_new: list[int], seeds: list[int], episodes=None
    ) -> list[Sample]:
        model = self.policy.model
        was_training = model.training
        model.eval()  # no dropout while sampling
        cpu = next(model.parameters()).device.type == "cpu"  # on a GPU threads only launch
        self.prompt_tokens += sum(map(len, prompts))
        self.busy.start()
        try:
            with torch_threads(self.cfg.threads) if cpu else contextlib.nullcontext():
                return self._generate(model, prompts, max_new, seeds)  # ends in a host sync
        finally:
            self.busy.stop()
            model.train(was_training)

    def _prefill(self, model, prompts, cache, device) -> torch.Tensor:
        """Fill the static cache (left-padded to L) from unpadded prefills of each prompt's part
        not in the prefix store; returns the last logits (B, V)."""
        from transformers import DynamicCache

        B, L = len(prompts), max(len(p) for p in prompts)
        jobs, fresh = [], []  # jobs: (prompt indices, (cached length, kv) or None)
        for i, p in enumerate(prompts):
            hit = self.prefixes.take(p) if self.prefixes is not None else None
            jobs += [([i], hit)] if hit else []
            fresh += [] if hit else [i]
        jobs += [
            ([fresh[r] for r in g], None) for g in prefill_groups([len(prompts[i]) for i in fresh])
        ]
        last = [None] * B
        for rows, hit in jobs:
            start, n = hit[0] if hit else 0, len(prompts[rows[0]])
            part = DynamicCache(config=model.config)
            for layer_idx, (k, v) in enumerate(hit[1] if hit else []):
                part.update(k, v, layer_idx)  # the cached prefix: positions 0..start-1
            ids = torch.tensor([prompts[i][start:] for i in rows], device=device)  # (g, n-start)
            self.prefilled_tokens += ids.numel()
            out = model(
                input_ids=ids, **{cache_kwarg(model): part}, use_cache=True, logits_to_keep=1
            )
            index = torch.tensor(rows, device=device)
            for layer, src in zip(cache.layers, part.layers, strict=True):
                if not layer.is_initialized:  # allocates (B, kv heads, T, head dim) zeros
                    layer.lazy_initialization(src.keys[:1].expand(B, -1, -1, -1), src.values[:1])
                    layer.cumulative_length.fill_(L)  # decode writes slot L, L+1, ...
                layer.keys[index, :, L - n : L] = src.keys  # (g, kv heads, n, head dim)
                layer.values[index, :, L - n : L] = src.values
            for r, i in enumerate(rows):
                last[i] = out.logits[r, -1]
        return torch.stack(last)

    def _store(self, cache, slots, rows, prompts, toks, n_out, L) -> None:
        """Keep the K/V of finished running rows `slots` (prompt indices `rows`) for the next
        message: the prompt and every sampled id but the last (never fed back)."""
        if self.prefixes is None:
            return
        for slot, i in zip(slots.tolist(), rows.tolist(), strict=True):
            fed = int(n_out[i]) - 1
            window = slice(L - len(prompts[i]), L + fed)
            kv = [
                (
                    x.keys[slot : slot + 1, :, window].clone(),
                    x.values[slot : slot + 1, :, window].clone(),
                )
                for x in cache.layers
            ]
            self.prefixes.put(prompts[i] + toks[i, :fed].tolist(), kv)

    def _generate(self, model, prompts, max_new, seeds) -> list[Sample]:
        from transformers import StaticCache

        device = next(model.parameters()).device
        B, L = len(prompts), max(len(p) for p in prompts)
        N = max(1, *max_new)  # decode steps at most; every row samples at least one token
        cache = StaticCache(config=model.config, max_cache_len=L + N)
        if any(type(layer).__name__ != "StaticLayer" for layer in cache.layers):
            raise NotImplementedError(
                f"HFEngine supports full-attention models only, {type(model).__name__} has "
                "sliding-window or linear-attention layers: use rollout.engine=vllm"
            )
        logits = self._prefill(model, prompts, cache, device)  # (B, V)
        kw = cache_kwarg(model)
        lengths = torch.tensor([len(p) for p in prompts], device=device)  # (B,)
        mask = torch.arange(L + N, device=device) >= (L - lengths)[:, None]  # (B, T) prompt
        mask[:, L:] = False  # generated slots switch on one per step
        mask = mask[:, None, None, :]  # (B, 1, 1, T): the 4D mask transformers passes through
        limit = torch.tensor([max(1, n) for n in max_new], device=device)  # (B,)
        u = uniforms(seeds, N).to(device)  # (B, N)
        rows = torch.arange(B, device=device)  # running row -> prompt index
        toks = torch.full((B, N), self.pad_id, dtype=torch.long, device=device)
        lps = torch.zeros((B, N), device=device)
        n_out = torch.zeros(B, dtype=torch.long, device=device)  # tokens kept per prompt
        done = torch.zeros(B, dtype=torch.bool, device=device)  # per running row
        stop = torch.tensor(self.renderer.stop_ids, device=device)  # any ends a message
        temperature, top_p = self.cfg.temperature, self.cfg.top_p
        for t in range(N):
            tok = sample_next(logits, temperature, top_p, u[:, t])  # (b,)
            toks[rows, t] = tok
            lps[rows, t] = token_logprob(logits, tok)
            finished = ~done & (torch.isin(tok, stop) | (t + 1 >= limit))
            n_out[rows[finished]] = t + 1
            done |= finished
            live = int((~done).sum())  # the one host sync per step
            if live == 0:
                break
            if live <= 3 * len(rows) // 4:  # cut the finished rows, a quarter at a time
                keep = (~done).nonzero()[:, 0]
                cut = done.nonzero()[:, 0]
                self._store(cache, cut, rows[cut], prompts, toks, n_out, L)
                cache.reorder_cache(keep)
                mask, limit, u, rows = mask[keep], limit[keep], u[keep], rows[keep]
                done, lengths, tok = done[keep], lengths[keep], tok[keep]
            mask[:, :, :, L + t] = True
            out = model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=(lengths + t)[:, None],
                **{kw: cache},
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1]  # (b, V)
        self._store(cache, torch.arange(len(rows)), rows, prompts, toks, n_out, L)
        ids, lps, n_out = toks.tolist(), lps.tolist(), n_out.tolist()
        return [Sample(ids[i][: n_out[i]], lps[i][: n_out[i]]) for i in range(B)]
