"""The `rollout:` section of params.yaml: which engine, which scheduler, budgets, vLLM servers.

Loaded with `rcgrpo.config.load_section("rollout", RolloutConfig)`; `rcgrpo.rollout.engine`
re-exports it (`from rcgrpo.rollout.engine import RolloutConfig` keeps working).

Schedulers (rcgrpo.rollout.scheduler): `async` (default) keeps every episode of a rollout call in
flight at once, up to `max_in_flight`; each sends its next request as soon as its own tool results
are back, and tool calls of different episodes run concurrently in `tool_workers` sandbox
workers. `lockstep` is the old loop: every message round waits for the slowest episode.

vLLM servers (rcgrpo.rollout.vllm_engine): `vllm_servers` servers (or one per entry of
`vllm_devices`, each entry the CUDA_VISIBLE_DEVICES of one server), each with
`tensor_parallel_size` GPUs; an episode's first request goes to the least-loaded server and its
later turns stay there (its prefix cache). `vllm_sleep_mode`: colocated with training, the
servers sleep after each rollout call and wake at the next sync or rollout.

    .venv/bin/pytest tests/test_scheduler.py -q
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rcgrpo.config import ranged
from rcgrpo.rollout.agent_loop import Limits


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
    max_batch: int = ranged(64, "[1, inf)")  # most sequences in one batched generate call (hf)
    prefix_cache: bool = True  # hf: an episode's next message prefills only its new tokens
    # hf on the CPU: torch threads while generating (0 = runtime.torch_threads)
    threads: int = ranged(0, "[0, inf)")
    scheduler: str = "async"  # "async" (episodes in flight at once) | "lockstep" (rounds)
    max_in_flight: int = ranged(1280, "[1, inf)")  # async: most episodes in flight at once
    tool_workers: int = ranged(0, "[0, inf)")  # async: sandbox workers for tools (0 = CPU count)
    # vllm only: share of GPU memory for the engine
    vllm_gpu_memory_utilization: float = ranged(0.6, "(0, 1]")
    vllm_max_lora_rank: int = ranged(0, "[0, inf)")  # vllm: --max-lora-rank (0 = model.lora_r)
    vllm_servers: int = ranged(1, "[1, inf)")  # vllm: servers (data parallel), one per device set
    vllm_devices: tuple[str, ...] = ()  # vllm: CUDA_VISIBLE_DEVICES per server (() = in order)
    tensor_parallel_size: int = ranged(1, "[1, inf)")  # vllm: GPUs per server
    vllm_max_num_seqs: int = ranged(256, "[1, inf)")  # vllm: sequences a server runs at once
    vllm_prefix_caching: bool = True  # vllm: --enable-prefix-caching (hit rate logged per call)
    # vllm colocated: sleep after each rollout, wake at sync; None = on for the hub profiles on
    # CUDA with one server per rank (rcgrpo.rollout.colocate)
    vllm_sleep_mode: bool | None = None

    def __post_init__(self):
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"rollout.engine must be 'hf' or 'vllm', got {self.engine!r}")
        if self.protocol not in ("bfcl", "combined"):
            raise ValueError(f"rollout.protocol must be 'bfcl' or 'combined': {self.protocol!r}")
        if self.scheduler not in ("async", "lockstep"):
            raise ValueError(f"rollout.scheduler must be 'async' or 'lockstep': {self.scheduler!r}")
        if not 0 < self.top_p <= 1 or self.temperature < 0:
            raise ValueError("rollout.top_p must be in (0, 1] and temperature >= 0")
        if self.max_new_tokens < 0 or self.max_total_tokens < 0:
            raise ValueError(
                "rollout.max_new_tokens / max_total_tokens must be >= 0 (0 = profile's)"
            )
        if self.threads < 0:
            raise ValueError(f"rollout.threads must be >= 0 (0 = default), got {self.threads}")
        if self.vllm_devices:
            object.__setattr__(self, "vllm_devices", tuple(str(d) for d in self.vllm_devices))
            if self.vllm_servers not in (1, len(self.vllm_devices)):
                raise ValueError(
                    f"rollout.vllm_servers={self.vllm_servers} but {len(self.vllm_devices)} "
                    "vllm_devices: one server per device entry (leave vllm_servers at 1)"
                )
            for entry in self.vllm_devices:
                if len(entry.split(",")) != self.tensor_parallel_size:
                    raise ValueError(
                        f"rollout.vllm_devices entry {entry!r} lists "
                        f"{len(entry.split(','))} GPU(s), tensor_parallel_size is "
                        f"{self.tensor_parallel_size}: each entry is one server's GPUs"
                    )

    @property
    def n_servers(self) -> int:
        """vLLM servers to start: one per vllm_devices entry, else vllm_servers."""
        return len(self.vllm_devices) or self.vllm_servers

    def server_devices(self, visible: list[str]) -> list[str | None]:
        """CUDA_VISIBLE_DEVICES of each server: vllm_devices as given, else consecutive groups
        of tensor_parallel_size of the `visible` GPUs (None each on a machine without GPUs)."""
        if self.vllm_devices:
            return list(self.vllm_devices)
        if not visible:
            return [None] * self.n_servers
        tp, need = self.tensor_parallel_size, self.n_servers * self.tensor_parallel_size
        if need > len(visible):
            raise ValueError(
                f"rollout.vllm_servers={self.n_servers} x tensor_parallel_size={tp} needs "
                f"{need} GPUs, {len(visible)} visible ({','.join(visible)})"
            )
        return [",".join(visible[i * tp : (i + 1) * tp]) for i in range(self.n_servers)]

    @property
    def limits(self) -> Limits:
        if not (self.max_new_tokens and self.max_total_tokens):
            raise ValueError("token limits unresolved: call RolloutConfig.for_policy(policy)")
        return Limits(self.max_new_tokens, self.max_total_tokens, self.max_steps)

    def for_policy(self, policy) -> RolloutConfig:
        """This config with every 0 token limit set to the policy's profile budget."""
        from rcgrpo.models.profiles import PROFILES

        profile = PROFILES[policy.config.profile]
        return replace(
            self,
            max_new_tokens=self.max_new_tokens or profile.max_new_tokens,
            max_total_tokens=self.max_total_tokens or profile.max_total_tokens,
        )
