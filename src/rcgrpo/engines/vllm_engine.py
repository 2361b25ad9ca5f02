"""The vLLM rollout engine (GPU machines): LoRA adapters through LoRARequest, prefix caching.

vLLM serves a plain folder exported from the policy (models.export_for_serving: base weights
with the reward tokens and their current rows). For a LoRA policy every `sync` writes the LoRA
matrices as a new adapter version (`policy-v1`, `policy-v2`, ...) and later requests name it, so
rollouts never run on a stale adapter. vLLM cannot take embedding rows through a LoRA adapter:
when the reward-token rows have moved since the export (peft trainable tokens), or the policy is
a full fine-tune, `sync` re-exports the weights and restarts the engine (slow; it says so).
Prefix caching reuses the KV of the shared system prompt and of earlier turns across steps.
Log-probs are vLLM's raw (temperature-1) log-probs of the sampled tokens, like the HF engine.

Install on a GPU machine with `pip install -e ".[gpu]"`; tests skip when vllm is absent:

    .venv/bin/pytest tests/test_engines.py -q -k vllm
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

from rcgrpo.engines.base import Engine, RolloutConfig, Sample


class VLLMEngine(Engine):
    def __init__(self, cfg: RolloutConfig, policy, workdir: str | Path | None = None):
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise ImportError(
                "rollout.engine is 'vllm' but vllm is not installed: on a GPU machine run "
                "`pip install -e '.[gpu]'`, or set rollout.engine: hf"
            ) from None
        super().__init__(cfg, policy)
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rcgrpo-vllm-"))
        self.version = 0
        self.lora_request = None
        self._start(policy)

    def _start(self, policy) -> None:
        """Export the policy, start vLLM on it, and register the current adapter."""
        from vllm import LLM

        from rcgrpo.models import export_for_serving, reward_rows

        self.version += 1
        base = export_for_serving(policy, self.workdir / f"base-v{self.version}")
        self.served_rows = reward_rows(policy)
        self.llm = LLM(
            model=str(base),
            tokenizer=str(base),
            dtype=policy.config.dtype,
            seed=0,
            enable_prefix_caching=True,
            enable_lora=policy.is_lora,
            max_lora_rank=self.cfg.vllm_max_lora_rank,
            max_model_len=self.cfg.max_total_tokens + self.cfg.max_new_tokens,
            gpu_memory_utilization=self.cfg.vllm_gpu_memory_utilization,
        )
        self.policy = policy
        self._register_adapter(policy)

    def _register_adapter(self, policy) -> None:
        if not policy.is_lora:
            self.lora_request = None
            return
        from vllm.lora.request import LoRARequest

        from rcgrpo.models import export_lora

        path = export_lora(policy, self.workdir / f"adapter-v{self.version}")
        self.lora_request = LoRARequest(f"policy-v{self.version}", self.version, str(path))

    def sync(self, policy) -> None:
        import torch

        from rcgrpo.models import reward_rows

        rows_moved = not torch.allclose(reward_rows(policy), self.served_rows, atol=0, rtol=0)
        if not policy.is_lora or rows_moved:
            warnings.warn(
                "vLLM sync: full weights / moved reward-token rows cannot go through a LoRA "
                "adapter; re-exporting and restarting the engine (set model.train_reward_rows: "
                "false with LoRA to avoid this)",
                stacklevel=2,
            )
            del self.llm
            torch.cuda.empty_cache()
            return self._start(policy)
        self.version += 1
        self.policy = policy
        self._register_adapter(policy)

    def generate(
        self, prompts: list[list[int]], max_new: list[int], seeds: list[int]
    ) -> list[Sample]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                temperature=self.cfg.temperature,
                top_p=self.cfg.top_p,
                max_tokens=n,
                seed=seed % (1 << 31),
                stop_token_ids=[self.policy.stop_id],
                logprobs=0,  # the sampled token's log-prob only
                skip_special_tokens=False,
                detokenize=False,
            )
            for n, seed in zip(max_new, seeds, strict=True)
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            sampling_params=params,
            lora_request=self.lora_request,
            use_tqdm=False,
        )
        samples = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [
                step[tok].logprob for tok, step in zip(ids, completion.logprobs, strict=True)
            ]
            samples.append(Sample(ids, logprobs))
        return samples
