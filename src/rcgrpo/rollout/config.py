"""The `rollout:` section of params.yaml: which engine, which scheduler, budgets, vLLM servers.

Loaded with `rcgrpo.config.load_section("rollout", RolloutConfig)`; `rcgrpo config show rollout`
prints every field with its value, rule and help.

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

from dataclasses import replace
from typing import Literal

from rcgrpo.fields import config_class, ranged, setting
from rcgrpo.rollout.agent_loop import Limits

# vllm.config.lora.MaxLoRARanks (vLLM 0.32): the only --max-lora-rank values a server accepts
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@config_class
class RolloutConfig:
    """params.yaml `rollout:` section."""

    engine: Literal["hf", "vllm"] = setting(
        "hf", "hf: the transformers generate loop; vllm: a vLLM server (own venv)"
    )
    protocol: Literal["combined", "bfcl"] = setting(
        "combined", "combined: the paper's Step 1..n + done(); bfcl: turn by turn"
    )
    temperature: float = ranged(1.0, "[0, inf)", "sampling temperature (0 = greedy)")
    top_p: float = ranged(1.0, "(0, 1]", "nucleus sampling mass")
    max_new_tokens: int = ranged(
        0, "[0, inf)", "per model message (0 = the model profile's budget)"
    )
    max_total_tokens: int = ranged(
        0,
        "[0, inf)",
        "per episode: prompt + every turn (0 = the profile's: all 800 ground truths fit)",
    )
    max_steps: int = ranged(20, "[1, inf)", "model messages per turn (BFCL's step limit)")
    max_batch: int = ranged(64, "[1, inf)", "hf: most sequences in one batched generate call")
    prefix_cache: bool = setting(True, "hf: an episode's next message prefills only new tokens")
    threads: int = ranged(
        0, "[0, inf)", "hf on the CPU: torch threads while generating (0 = runtime.torch_threads)"
    )
    scheduler: Literal["async", "lockstep"] = setting(
        "async", "async: episodes in flight at once; lockstep: rounds wait for the slowest"
    )
    max_in_flight: int = ranged(1280, "[1, inf)", "async: most episodes in flight at once")
    tool_workers: int = ranged(
        0, "[0, inf)", "async: sandbox workers running tool calls (0 = one per core, <= 16)"
    )
    vllm_gpu_memory_utilization: float = ranged(
        0.6, "(0, 1]", "vllm: share of GPU memory for the engine"
    )
    vllm_max_lora_rank: int = ranged(0, "[0, inf)", "vllm: --max-lora-rank (0 = model.lora_r)")
    vllm_servers: int = ranged(1, "[1, inf)", "vllm: servers (data parallel), one per device set")
    vllm_devices: tuple[str, ...] = setting(
        (), 'vllm: CUDA_VISIBLE_DEVICES per server, e.g. ["0,1", "2,3"] ([] = in order)'
    )
    tensor_parallel_size: int = ranged(1, "[1, inf)", "vllm: GPUs per server")
    vllm_max_num_seqs: int = ranged(256, "[1, inf)", "vllm: sequences a server runs at once")
    vllm_prefix_caching: bool = setting(
        True, "vllm: --enable-prefix-caching (hit rate: rollout/prefix_cache_hit_rate)"
    )
    vllm_sleep_mode: bool | None = setting(
        None,
        "vllm colocated: sleep during the update, wake for rollouts"
        " (null = on for hub profiles on CUDA, one server per rank)",
    )

    def __post_init__(self):
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

    def served_lora_rank(self, lora_r: int) -> int:
        """vLLM's --max-lora-rank for adapters of rank `lora_r`: vllm_max_lora_rank, else the
        adapter's rank rounded up to a rank vLLM accepts (it refuses any other value at start)."""
        want = self.vllm_max_lora_rank or lora_r
        fits = [r for r in VLLM_LORA_RANKS if r >= want]
        if not fits:
            raise ValueError(f"LoRA rank {want} is above vLLM's largest, {VLLM_LORA_RANKS[-1]}")
        return fits[0]


def for_inference(cfg: RolloutConfig, servers: int, utilization: float, visible: list[str]):
    """The rollout settings of a stage that no trainer shares the GPUs with (the data stage's
    base-policy rollouts, the evaluations): vLLM on every visible GPU, at `utilization`, never
    asleep. `servers` 0 = one server per tensor_parallel_size GPUs of `visible` (the CPU, with
    none visible: the rollout section's count); vllm_devices, when the user pinned them, stay.
    The transformers engine is returned as it is (it has no servers)."""
    import dataclasses

    if cfg.engine != "vllm":
        return cfg
    out = dataclasses.replace(cfg, vllm_gpu_memory_utilization=utilization, vllm_sleep_mode=False)
    if cfg.vllm_devices:
        return out
    n = servers or len(visible) // cfg.tensor_parallel_size or cfg.n_servers
    return dataclasses.replace(out, vllm_servers=n)
