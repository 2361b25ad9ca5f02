"""The rollout engine interface: many BFCL episodes in flight, batched generation underneath.

`Engine.rollout(tasks, reward_tokens, protocol, seed)` creates one AgentLoop per task (repeat a
task G times for a GRPO group), then repeatedly gathers every episode waiting for the model and
generates their next messages in one batched call (`generate`, the engine-specific part; an
engine may also keep per-episode state, dropped in `finished`), until all episodes are over.
Seeds are per episode and per step, `(seed, episode index, step)`, so an episode's samples do not
depend on which other episodes share its batch.

    from rcgrpo.rollout.execution import make_engine
    engine = make_engine(RolloutConfig(), policy)
    rollouts = engine.rollout(tasks, reward_tokens=["<|high_reward|>"] * len(tasks), seed=0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rcgrpo.bfcl.tasks import Task
from rcgrpo.chat.prompts import Renderer
from rcgrpo.chat.record import Provenance
from rcgrpo.config import ranged
from rcgrpo.rollout.agent_loop import AgentLoop, Limits, Rollout
from rcgrpo.rollout.agent_loop import results as scored_results


@dataclass(frozen=True)
class RolloutConfig:
    """params.yaml `rollout:` section."""

    engine: str = "hf"  # "hf" (transformers generate loop) | "vllm" (vLLM server, own venv)
    protocol: str = "combined"  # "combined" (paper, Step 1..n + done()) | "bfcl" (turn by turn)
    temperature: float = ranged(1.0, "[0, inf)")  # 0 = greedy
    top_p: float = ranged(1.0, "(0, 1]")  # nucleus sampling mass
    # per model message (0 = the model profile's, rcgrpo.models.profiles.PROFILES)
    max_new_tokens: int = ranged(0, "[0, inf)")
    # per episode: prompt + every turn (0 = the model profile's)
    max_total_tokens: int = ranged(0, "[0, inf)")
    max_steps: int = ranged(20, "[1, inf)")  # model messages per turn (BFCL's step limit)
    max_batch: int = ranged(64, "[1, inf)")  # most sequences in one batched generate call
    prefix_cache: bool = True  # hf: an episode's next message prefills only its new tokens
    # hf on the CPU: torch threads while generating (0 = runtime.torch_threads)
    threads: int = ranged(0, "[0, inf)")
    # vllm only: share of GPU memory for the engine
    vllm_gpu_memory_utilization: float = ranged(0.6, "(0, 1]")
    vllm_max_lora_rank: int = ranged(64, "[1, inf)")  # vllm only: upper bound on the adapter rank

    def __post_init__(self):
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"rollout.engine must be 'hf' or 'vllm', got {self.engine!r}")
        if self.protocol not in ("bfcl", "combined"):
            raise ValueError(f"rollout.protocol must be 'bfcl' or 'combined': {self.protocol!r}")
        if not 0 < self.top_p <= 1 or self.temperature < 0:
            raise ValueError("rollout.top_p must be in (0, 1] and temperature >= 0")
        if self.max_new_tokens < 0 or self.max_total_tokens < 0:
            raise ValueError(
                "rollout.max_new_tokens / max_total_tokens must be >= 0 (0 = profile's)"
            )
        if self.threads < 0:
            raise ValueError(f"rollout.threads must be >= 0 (0 = default), got {self.threads}")

    @property
    def limits(self) -> Limits:
        if not (self.max_new_tokens and self.max_total_tokens):
            raise ValueError("token limits unresolved: call RolloutConfig.for_policy(policy)")
        return Limits(self.max_new_tokens, self.max_total_tokens, self.max_steps)

    def for_policy(self, policy) -> RolloutConfig:
        """This config with every 0 token limit set to the policy's profile budget."""
        from dataclasses import replace

        from rcgrpo.models.profiles import PROFILES

        profile = PROFILES[policy.config.profile]
        return replace(
            self,
            max_new_tokens=self.max_new_tokens or profile.max_new_tokens,
            max_total_tokens=self.max_total_tokens or profile.max_total_tokens,
        )


@dataclass
class Sample:
    """One generated message: sampled ids (stop token included when it was sampled) and
    log p(id) under the policy at temperature 1 (what a training forward pass recomputes)."""

    ids: list[int]
    logprobs: list[float]


def episode_seed(seed: int, index: int, step: int) -> int:
    """A 63-bit seed for (run seed, episode, step): mixes with large odd constants."""
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + step * 0x94D049BB133111EB) & (
        (1 << 63) - 1
    )


class Engine:
    """Base class: the episode scheduler. Subclasses implement `generate` and `sync`."""

    def __init__(self, cfg: RolloutConfig, policy):
        self.cfg = cfg.for_policy(policy)  # 0 token limits = the profile's budgets
        self.policy = policy
        self.renderer = Renderer(policy.tokenizer, policy.stop_id, getattr(policy, "also_stop", ()))
        self.generated_tokens = 0  # running count, for benchmarks and logs

    def generate(
        self, prompts: list[list[int]], max_new: list[int], seeds: list[int]
    ) -> list[Sample]:
        """Continue every prompt by one message (until the stop token or max_new[i] tokens)."""
        raise NotImplementedError

    def sync(self, policy) -> None:
        """Serve the weights of `policy` from now on (call after every optimizer step)."""
        raise NotImplementedError

    def finished(self, ids: list[int]) -> None:
        """An episode of the running rollout is over, `ids` its final sequence: an engine that
        keeps per-episode state (HFEngine's K/V) drops it here."""

    def rollout(
        self,
        tasks: Sequence[Task],
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
        loops = [
            AgentLoop(
                task, self.renderer, protocol, token, self.cfg.limits, self.policy.compact_docs,
                Provenance(generator="rollout", model=self.policy.name, seed=seed),
            )
            for task, token in zip(tasks, reward_tokens, strict=True)
        ]  # fmt: skip
        steps = [0] * len(loops)
        while waiting := [i for i, loop in enumerate(loops) if loop.pending() is not None]:
            # Longest first: sequences of similar length share a batch (less padding).
            waiting.sort(key=lambda i: -len(loops[i].ids))
            for start in range(0, len(waiting), self.cfg.max_batch):
                batch = waiting[start : start + self.cfg.max_batch]
                samples = self.generate(
                    [loops[i].ids for i in batch],
                    [loops[i].max_new() for i in batch],
                    [episode_seed(seed, first_index + i, steps[i]) for i in batch],
                )
                for i, sample in zip(batch, samples, strict=True):
                    self.generated_tokens += len(sample.ids)
                    loops[i].feed(sample.ids, sample.logprobs)
                    steps[i] += 1
                    if loops[i].pending() is None:
                        self.finished(loops[i].ids)
        results = scored_results(loops)  # one scoring request for the whole batch
        check_sampled(results, self.cfg.max_total_tokens)
        return results


def check_sampled(rollouts: list[Rollout], budget: int) -> None:
    """Episodes that stopped before their first token (prompt over the episode budget) train
    and score nothing: warn with counts; a batch where every episode did so is an error."""
    import warnings

    empty = [r for r in rollouts if r.n_sampled == 0]
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
