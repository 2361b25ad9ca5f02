"""The rollout engine interface: many episodes in flight, batched generation underneath.

`Engine.rollout(tasks, reward_tokens, protocol, seed)` runs one AgentLoop per task (repeat a
task G times for a GRPO group) on an episode the run's environment opens (its tool calls in the
environment's workers, one set per engine) until all episodes are over, scores them in one
batch with the environment's scorer, through the scheduler that
rollout.scheduler names (rcgrpo.rollout.scheduler: `async`, every episode in flight at once up to
rollout.max_in_flight, or `lockstep` rounds). The engine-specific parts: `generate` (a batch of
prompts, one message each), `client` (how the async scheduler reaches the model: rounds of
`generate` by default, one request at a time for a server) and `sync` (new weights); an engine
may keep per-episode state, dropped in `finished`. Seeds are per episode and per step,
`(seed, episode index, step)`, so an episode's samples do not depend on which other episodes
share its batch. After each call `last_stats` holds what it cost (prompt tokens sent and
prefilled, prefix-cache hit rate, busy fraction): the RL step logs them.

    from rcgrpo.rollout.execution import make_engine
    engine = make_engine(RolloutConfig(), policy, environment)   # rcgrpo.envs.get(rc.env)
    rollouts = engine.rollout(tasks, reward_tokens=["<|high_reward|>"] * len(tasks), seed=0)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rcgrpo.chat.prompts import Renderer
from rcgrpo.chat.record import Provenance
from rcgrpo.rollout import scheduler
from rcgrpo.rollout.agent_loop import AgentLoop, Rollout, opening
from rcgrpo.rollout.agent_loop import results as scored_results
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.environment import Environment
from rcgrpo.rollout.scheduler import Clock, RoundBatcher


@dataclass
class Sample:
    """One generated message: sampled ids (stop token included when it was sampled) and
    log p(id) under the policy at temperature 1 (what a training forward pass recomputes)."""

    ids: list[int]
    logprobs: list[float]


class Engine:
    """Base class: runs the episodes of a rollout call through the configured scheduler.
    Subclasses implement `generate` and `sync`; a server engine also overrides `client`."""

    # the temperature of the sampled-token log-probs every Sample carries (HF and vLLM: raw
    # log softmax, 1); None for an engine without them (rl.behaviour_logprobs=engine refuses it)
    logprobs_temperature: float | None = 1.0

    def __init__(self, cfg: RolloutConfig, policy, env: Environment):
        self.cfg = cfg.for_policy(policy)  # 0 token limits = the profile's budgets
        self.policy, self.env = policy, env
        self.renderer = Renderer(policy.tokenizer, policy.stop_id, getattr(policy, "also_stop", ()))
        self.generated_tokens = 0  # running count, for benchmarks and logs
        self.prompt_tokens = 0  # running count of the prompt tokens of every request
        self.prefilled_tokens = 0  # of those, the ones the model computed (no cache hit)
        self.busy = Clock()  # time during which the model had a request in progress
        self.tools = env.workers(self.cfg.tool_workers)  # async: tool calls of episodes at once
        self.in_flight_max = 0  # most episodes in flight at once in the last rollout
        self.last_stats: dict[str, float] = {}  # the last rollout's engine metrics
        self._count = threading.Lock()  # the running counts, updated from many threads
        self._ticks: list = []  # watch(): called on every reply (a rank's heartbeat)

    def generate(
        self, prompts: list[list[int]], max_new: list[int], seeds: list[int], episodes=None
    ) -> list[Sample]:
        """Continue every prompt by one message (until the stop token or max_new[i] tokens).
        episodes: the episode index of each prompt (a server engine routes by it)."""
        raise NotImplementedError

    def sync(self, policy) -> None:
        """Serve the weights of `policy` from now on (call after every optimizer step)."""
        raise NotImplementedError

    def score(self, ids: list[int]) -> list[list[float]]:
        """log p(ids[t] | ids[:t]) for t = 1 .. n-1 at temperature 1, as the engine serves the
        policy now, one list per replica that serves it (each vLLM server): what the sync probe
        compares with the trainer's (rcgrpo.training.grpo.sync_probe)."""
        raise NotImplementedError

    def watch(self, tick) -> None:
        """Call tick() on every reply of the model from now on (any thread): a launched rank's
        heartbeat sees a rollout progress whether or not its own model runs the forwards."""
        self._ticks.append(tick)

    def replied(self, sample: Sample) -> None:
        """One message came back (every scheduler calls this): counted, and the watchers ticked."""
        with self._count:
            self.generated_tokens += len(sample.ids)
        for tick in self._ticks:
            tick()

    def finished(self, ids: list[int], episode: int | None = None) -> None:
        """An episode of the running rollout is over, `ids` its final sequence: an engine that
        keeps per-episode state (HFEngine's K/V, the vLLM router's server choice) drops it."""

    def close(self) -> None:
        """Release what the engine holds beside the model (its tool workers; servers)."""
        self.tools.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def client(self, flight):
        """What the async scheduler sends each request to: a blocking, thread-safe callable
        (prompt, max_new, seed, episode) -> Sample with `finished(ids, episode)`, used as a
        context manager. Default: rounds of `generate` (scheduler.RoundBatcher)."""
        return RoundBatcher(self, flight)

    def rollout(
        self,
        tasks: Sequence,
        reward_tokens: Sequence[str | None] | str | None = None,
        protocol: str | None = None,
        seed: int = 0,
        first_index: int = 0,
    ) -> list[Rollout]:
        """Roll out every task once (in order); reward_tokens: one per task, or one for all.
        first_index: the episode index of tasks[0] in the whole run, so a shard of a run
        (rcgrpo.rollout.execution) samples with the same per-episode seeds as the run in one call."""
        if reward_tokens is None or isinstance(reward_tokens, str):
            reward_tokens = [reward_tokens] * len(tasks)
        if len(reward_tokens) != len(tasks):
            raise ValueError(f"{len(reward_tokens)} reward tokens for {len(tasks)} tasks")
        protocol = protocol or self.cfg.protocol
        provenance = Provenance(generator="rollout", model=self.policy.name, seed=seed)

        def make_loop(i: int, worker=None) -> AgentLoop:
            episode = self.env.episode(tasks[i], protocol, self.cfg.limits.max_steps, worker)
            return AgentLoop(
                episode,
                self.renderer,
                reward_tokens[i],
                self.cfg.limits,
                self.policy.compact_docs,
                replace(provenance),
            )

        before, start, restarts = self.counters(), time.perf_counter(), self.tools.restarts()
        if self.cfg.scheduler == "lockstep":
            # one after another in one worker: the engine's first (counted with the others)
            loops = [make_loop(i, self.tools.worker(0)) for i in range(len(tasks))]
            self.in_flight_max = len(loops)
            scheduler.lockstep(self, loops, seed, first_index)
        else:
            loops = scheduler.run_async(
                self, lambda i: make_loop(i, self.tools.worker(i)), len(tasks), seed, first_index
            )
        wall = time.perf_counter() - start
        results = scored_results(loops, self.env.scorer(protocol))  # the batch scored at once
        check_sampled(results, self.cfg.max_total_tokens)
        self.last_stats = self.stats(before, self.counters(), wall)
        # episodes that failed on their own (agent_loop.AgentLoop.feed): counted, not raised
        self.last_stats["rollout/episode_errors"] = float(
            sum(r.stop_reason == "error" for r in results)
        )
        # tool workers killed (a call over its limit) or dead (a crash, an outside kill): each
        # gave the call it cut short an error observation, or rebuilt its episodes
        self.last_stats["rollout/tool_workers_replaced"] = float(self.tools.restarts() - restarts)
        return results

    def prompt_lengths(
        self, tasks: Sequence, reward_token: str | None = None, protocol: str | None = None
    ) -> list[int]:
        """Tokens of each task's first prompt as `rollout` would send it (its reward goal, the
        profile's tool docs): check them against cfg.max_total_tokens before rolling out."""
        protocol, lengths = protocol or self.cfg.protocol, []
        for task in tasks:
            episode = self.env.episode(task, protocol, self.cfg.limits.max_steps)
            messages, _, tools = opening(episode, reward_token, self.policy.compact_docs)
            lengths.append(len(self.renderer.prompt(messages, tools)))
        return lengths

    # -- what a rollout cost -----------------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        """Running totals, read before and after a rollout call (`stats` takes the difference)."""
        return {
            "prompt": self.prompt_tokens,
            "prefilled": self.prefilled_tokens,
            "busy": self.busy.busy,
        }

    def stats(self, before: dict, after: dict, wall: float) -> dict[str, float]:
        """The engine's metrics of one rollout call (names defined in docs/metrics.md)."""
        sent, prefilled = (
            after["prompt"] - before["prompt"],
            after["prefilled"] - before["prefilled"],
        )
        return {
            "rollout/prompt_tokens": float(sent),
            "rollout/prefill_tokens": float(prefilled),
            "rollout/prefix_cache_hit_rate": 1.0 - prefilled / sent if sent else 0.0,
            "perf/engine_busy_frac": (after["busy"] - before["busy"]) / wall if wall else 0.0,
            "perf/in_flight_max": float(self.in_flight_max),
        }


def check_sampled(rollouts: list[Rollout], budget: int) -> None:
    """Episodes that stopped before their first token (prompt over the episode budget) train
    and score nothing: warn with counts; a batch where every episode did so is an error."""
    import warnings

    empty = [r for r in rollouts if r.n_sampled == 0 and r.stop_reason != "error"]
    if not empty:
        return
    longest = max(r.prompt_len for r in empty)
    msg = (
        f"{len(empty)} of {len(rollouts)} episodes sampled no token: their first prompt (up to "
        f"{longest} tokens) leaves no room in rollout.max_total_tokens = {budget}; raise it "
        "(0 = the model profile's budget)"
    )
    if len(empty) == len(rollouts):
        raise RuntimeError(msg)
    warnings.warn(msg, stacklevel=3)
