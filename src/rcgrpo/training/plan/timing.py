"""The time model of `rcgrpo plan`: one RL step's rollouts simulated on a decode cost model, and
its update from FLOPs at a stated MFU. A pure model, independent of the engines' code.

Rollouts. Every rank runs its own engine on its share of the step's groups (whole groups). An
episode is its sequence of model calls (episodes.json: prefill new tokens, then sample; the 800
ground truths replayed, scripts/episode_shapes.py), drawn per task with a fixed seed. One engine
is simulated iteration by iteration, as vLLM's continuous batching runs: at most `max_seqs`
sequences (rollout.vllm_max_num_seqs) whose keys and values fit its KV cache; each iteration
decodes one token of every running sequence and prefills up to CHUNK_TOKENS new tokens of the
others. An iteration costs the larger of its memory time (weights + the KV it reads, at
BANDWIDTH_EFF of the GPU's bandwidth) and its compute time (2 x params per token + attention,
at PREFILL_EFF of the peak), plus ITERATION_S (each assumed, or measured: Engine.k). Two
schedules over that engine:
* lock-step (`rollout.scheduler: lockstep`): every episode waiting for the model sends its next
  message at once; the round ends when the slowest is done, then the tool calls run; then the
  next round;
* async (`rollout.scheduler: async`, the default, rcgrpo.rollout.scheduler): each episode sends
  its next message as soon as its own tool call returns; the engine never waits for a round.
The G rollouts of a task share their first prompt's prefix: vLLM's prefix cache (on by default)
prefills it once per group (the goal and what follows it, PREFIX_TAIL tokens, for the others).
Between messages an episode's keys and values are assumed to stay cached (no re-prefill).

Update. FLOPs of pi_old (none with rl.behaviour_logprobs: engine) and the reference (one
forward each), then per PPO pass a forward, the checkpointed recompute and the backward, over
the computed tokens of the token-budget micro-batches (padding included), causal attention and
the LM head at the sampled positions, as rcgrpo.training.plan.flops counts them; divided by
GPUs x peak x MFU.

    .venv/bin/pytest tests/test_plan.py -q -k timing
"""

from __future__ import annotations

import heapq
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from rcgrpo.training.batching import computed_tokens, micro_batches
from rcgrpo.training.plan.calibration import ASSUMED, Assumed
from rcgrpo.training.plan.constants import GPU, TOOL_S, Arch
from rcgrpo.training.plan.flops import Work, causal_pairs, step_flops

PREFIX_TAIL = 64  # first-prompt tokens past the shared prefix (the goal onward): an assumption
EPISODES = Path(__file__).with_name("episodes.json")


def episode_shapes() -> dict[str, list[tuple[int, int]]]:
    """task id -> [(prefill, sampled), ...] of its replayed ground truth."""
    data = json.loads(EPISODES.read_text())
    return {k: [tuple(s) for s in v] for k, v in data["episodes"].items()}


def draw_step(shapes: dict, tasks: int, group: int, seed: int = 0) -> list[list[list[tuple]]]:
    """The step's groups: `tasks` task shapes drawn without replacement (with, past the 800),
    each repeated `group` times."""
    rng = random.Random(seed)
    ids = sorted(shapes)
    picks = rng.sample(ids, tasks) if tasks <= len(ids) else [rng.choice(ids) for _ in range(tasks)]
    return [[list(shapes[tid]) for _ in range(group)] for tid in picks]


@dataclass(order=True)
class _Req:
    ready: float
    order: int
    episode: int = field(compare=False)
    prefill: int = field(compare=False)  # new tokens still to prefill
    decode: int = field(compare=False)  # tokens still to sample
    ctx: int = field(compare=False)  # tokens already in the KV cache


@dataclass
class Engine:
    """One simulated inference engine (a vLLM server on one GPU)."""

    arch: Arch
    b: int  # bytes per weight / KV element
    gpu: GPU
    kv_tokens: float  # KV cache capacity, tokens
    max_seqs: int  # rollout.vllm_max_num_seqs (vLLM --max-num-seqs)
    iterations: int = 0
    k: Assumed = ASSUMED  # efficiencies, iteration overhead, chunk (assumed or measured)

    def iteration_s(self, decodes: list[int], prefills: list[tuple[int, int]]) -> float:
        """decodes: context of each decoding sequence; prefills: (chunk tokens, context)."""
        a, n_tok = self.arch, len(decodes) + sum(c for c, _ in prefills)
        kv_per_tok = 2 * a.layers * a.kv_dim * self.b
        read = a.params() * self.b + kv_per_tok * (sum(decodes) + sum(x for _, x in prefills))
        attn = 4 * a.layers * a.q_dim * (sum(decodes) + sum(c * (x + c / 2) for c, x in prefills))
        flops = 2 * a.params() * n_tok + attn
        compute = flops / (self.gpu.bf16_flops * self.k.prefill_eff)
        memory = read / (self.gpu.bandwidth * self.k.bandwidth_eff)
        return max(memory, compute) + self.k.iteration_s

    def serve(self, queue: list[_Req], now: float, on_finish=None) -> float:
        """Run the requests of the heap `queue` (by ready time) to completion from time `now`;
        on_finish(request, time) may push follow-up requests. Returns the time all are done."""
        running: list[_Req] = []
        while queue or running:
            while queue and queue[0].ready <= now and len(running) < self.max_seqs:
                r, used = queue[0], sum(x.ctx + x.prefill + x.decode for x in running)
                if running and used + r.ctx + r.prefill + r.decode > self.kv_tokens:
                    break  # waits for KV room (a lone sequence always runs: it has to)
                running.append(heapq.heappop(queue))
            if not running:
                now = queue[0].ready
                continue
            decoding = [r for r in running if r.prefill == 0]
            budget, prefills = int(self.k.chunk_tokens) - len(decoding), []
            for r in running:
                if r.prefill and budget > 0:
                    chunk = min(r.prefill, budget)
                    prefills.append((chunk, r.ctx))
                    budget -= chunk
                    r.ctx, r.prefill = r.ctx + chunk, r.prefill - chunk
            now += self.iteration_s([r.ctx for r in decoding], prefills)
            self.iterations += 1
            for r in decoding:
                r.decode, r.ctx = r.decode - 1, r.ctx + 1
            for r in [r for r in running if r.prefill == 0 and r.decode == 0]:
                running.remove(r)
                if on_finish is not None:
                    on_finish(r, now)
        return now

    def run(self, episodes: list[list[tuple]], lock_step: bool, shared: list[bool]) -> float:
        """Wall time until every episode's last message is sampled (tool calls included).
        shared[e]: episode e's first prompt is in the prefix cache (a group mate's) but for
        its last PREFIX_TAIL tokens. A segment that samples nothing (an episode's closing
        tokens) is no model call."""
        episodes = [[seg for seg in ep if seg[1] > 0] for ep in episodes]
        n, count = len(episodes), [0]
        nxt, length = [0] * n, [0] * n

        def request(e: int, t: float) -> _Req:
            p, s = episodes[e][nxt[e]]
            count[0] += 1
            if nxt[e] == 0 and shared[e] and p > PREFIX_TAIL:  # the cached prefix is context
                return _Req(t, count[0], e, PREFIX_TAIL, s, p - PREFIX_TAIL)
            return _Req(t, count[0], e, p, s, length[e])

        def done(r: _Req, t: float) -> None:
            length[r.episode], nxt[r.episode] = r.ctx, nxt[r.episode] + 1
            if not lock_step and nxt[r.episode] < len(episodes[r.episode]):
                heapq.heappush(queue, request(r.episode, t + TOOL_S))

        if not lock_step:  # async: every episode moves on as soon as its tool call returns
            queue = [request(e, 0.0) for e in range(n)]
            heapq.heapify(queue)
            return self.serve(queue, 0.0, done)
        now = 0.0  # lock-step: rounds of blocking calls of at most max_seqs, longest first
        while waiting := [e for e in range(n) if nxt[e] < len(episodes[e])]:
            waiting.sort(key=lambda e: -length[e])
            for start in range(0, len(waiting), self.max_seqs):
                batch = waiting[start : start + self.max_seqs]
                queue = [request(e, now) for e in batch]
                heapq.heapify(queue)
                now = self.serve(queue, now, done) + TOOL_S * len(batch)  # then its tool calls
        return now


def rollout_seconds(groups, gpus: int, engine_args: dict, lock_step: bool) -> float:
    """The step's rollout time: whole groups dealt to the ranks in turn, every rank its own
    engine; the step waits for the slowest rank."""
    worst = 0.0
    for rank in range(gpus):
        mine = [ep for g in groups[rank::gpus] for ep in g]
        shared = [k > 0 for g in groups[rank::gpus] for k in range(len(g))]
        if mine:
            worst = max(worst, Engine(**engine_args).run(mine, lock_step, shared))
    return worst


def update_flops(
    arch: Arch,
    lengths: list[int],
    groups: list[list[int]],
    packed: bool,
    passes: int,
    reference: bool,
    checkpointing: bool,
    lora: bool,
    pi_old: bool = True,
    lora_params: int = 0,
    sampled: list[int] | None = None,
) -> float:
    """FLOPs of one step's training forwards and backwards over `groups` of `lengths` (the
    micro-batches of one pass; `sampled`: each rollout's sampled positions, None: no head
    counted), as rcgrpo.training.plan.flops counts them: padded rows (packed False) compute
    and attend k x the longest. pi_old False: no pi_old forward (`rl.behaviour_logprobs:
    engine`)."""
    work = Work(0.0, 0.0, 0.0)
    for g in groups:
        rows = [lengths[i] for i in g] if packed else [max(lengths[i] for i in g)] * len(g)
        heads = sum(sampled[i] for i in g) if sampled is not None else 0
        work += Work(computed_tokens(lengths, g, packed), causal_pairs(rows), heads)
    scoring = int(pi_old) + int(reference)
    return step_flops(arch, work, lora, lora_params, checkpointing, scoring, passes)


def step_micro_batches(
    lengths: list[int], budget: int, per_batch: int, mini: int, packed: bool, seed: int = 0
) -> list[list[int]]:
    """One pass's micro-batches: shuffled mini-batches of `mini` rollouts, each formed by tokens
    (budget > 0) or by count (`per_batch` rollouts)."""
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    mini = mini or len(order)
    out = []
    for i in range(0, len(order), mini):
        part = order[i : i + mini]
        if budget:
            out += [
                [part[j] for j in g]
                for g in micro_batches([lengths[k] for k in part], budget, packed)
            ]
        else:
            out += [part[j : j + per_batch] for j in range(0, len(part), per_batch)]
    return out


def vllm_pace(
    profile: str, b: int, device: str, gpu_bytes: float, share: float, tokens: int, max_seqs: int
) -> tuple[int, float] | None:
    """(episodes one vLLM server runs at once, its decode steps per second) when every episode
    runs to its budget of `tokens`: as many as its KV cache holds at utilization `share` of a
    GPU of `gpu_bytes` (at most max_seqs), each iteration decoding all of them at full context on
    the cost model above, on the GPU `device` names (GPUS; an unknown one: the slowest there).
    None for a profile without an architecture. LoRA slots are left out (two 7B r=16 adapters
    are ~0.2 GB beside tens of GB of KV)."""
    from rcgrpo.training.plan.constants import GPUS, architecture
    from rcgrpo.training.plan.memory import vllm_terms

    try:
        arch = architecture(profile)
    except KeyError:
        return None
    words = re.split(r"[\s_-]+", device.lower())  # "NVIDIA A100-SXM4-80GB"
    known = [g for key, g in GPUS.items() if key in words]
    gpu = known[0] if known else min(GPUS.values(), key=lambda g: g.bandwidth)
    kv = vllm_terms(arch, b, share, gpu_bytes, 0.0)[1]
    seqs = max(1, min(max_seqs, int(kv // max(tokens, 1))))
    engine = Engine(arch, b, gpu, kv, max_seqs)
    return seqs, 1.0 / engine.iteration_s([tokens] * seqs, [])
