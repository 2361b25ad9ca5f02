"""Memory-safe RL: masked LM head = full logits, the LoRA reference adapter,
gradient checkpointing. The memory itself is measured by bench/memory.py, not here.

    .venv/bin/pytest tests/test_rl_memory.py -q
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from test_trainer import TASKS, ToyEngine
from toy_models import tiny_llama

from rcgrpo.models.loading import load_policy, save_policy
from rcgrpo.models.profiles import PROFILES, ModelConfig
from rcgrpo.training.forward import scatter
from rcgrpo.training.grpo.config import RLConfig
from rcgrpo.training.grpo.core_algos import policy_loss, token_entropy, token_logprobs
from rcgrpo.training.grpo.trainer import Trainer


def full_logits_loss(model, ids, attn, mask, old, ref, adv, temperature):
    """The earlier full-logits path: logits (B, T-1, V) at every position, entropy over all of them."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    logp = token_logprobs(logits / temperature, ids[:, 1:])  # (B, T-1)
    loss, stats = policy_loss(logp, old, adv, mask, ref, entropy=token_entropy(logits.detach()))
    return logp, loss, stats


@pytest.mark.parametrize("chunk", [None, 4])  # one chunk; 3 chunks of <= 4 sampled positions
def test_masked_rl_path_gives_the_full_path_logprobs_loss_and_gradients(
    tmp_path, monkeypatch, chunk
):
    from rcgrpo.training.grpo import head

    if chunk:
        monkeypatch.setattr(head, "CHUNK", chunk)
    torch.manual_seed(0)
    model = tiny_llama(16, seed=3)
    trainer = Trainer(SimpleNamespace(model=model), None, [], RLConfig(), temperature=0.7)
    ids = torch.randint(0, 16, (3, 12))
    attn = torch.ones_like(ids)
    attn[2, 9:] = 0  # a padded row
    mask = torch.zeros(3, 11)
    mask[0, 4:7], mask[1, 8:], mask[2, 5:8] = 1, 1, 1  # ~1/3 of the positions sampled
    old = (-torch.rand(3, 11)) * mask
    ref = (-torch.rand(3, 11)) * mask
    adv = torch.tensor([1.0, -0.5, 0.25])

    model.train()
    logp, sampled, where = trainer._logprobs(model, ids, attn, mask)
    entropy = scatter(sampled.entropy, where)
    loss, stats = policy_loss(logp, old, adv, mask, ref, entropy=entropy)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    full_logp, full_loss, full_stats = full_logits_loss(model, ids, attn, mask, old, ref, adv, 0.7)
    full_loss.backward()

    torch.testing.assert_close(logp, full_logp * mask, rtol=0, atol=1e-6)
    assert abs(loss.item() - full_loss.item()) < 1e-6
    assert stats == pytest.approx(full_stats, abs=1e-6)  # entropy included: sampled positions
    assert stats["entropy"] > 0 and sampled.entropy.shape == (int(mask.sum()),)  # (N,), N = 9
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=1e-6)
    # the reference's log-probs through the trainer: the deep copy (full fine-tune) = the model
    with torch.no_grad():
        torch.testing.assert_close(trainer._ref_logprobs(ids, attn, mask), logp, atol=1e-6, rtol=0)


def test_lora_reference_is_the_starting_adapter_not_the_base_nor_a_copy(tmp_path):
    policy = load_policy(ModelConfig(profile="tiny", lora=True, lora_r=4, lora_alpha=8))
    model = policy.model
    with torch.no_grad():  # a fine-tuned start: adapter and reward-token rows away from the base
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    high = policy.reward_token_ids["<|high_reward|>"]
    ids = torch.tensor([[1, 2, high, 5, 9, 3, 7, 2, 4]])
    attn, mask = torch.ones_like(ids), torch.tensor([[0.0, 0, 0, 1, 1, 1, 0, 1]])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    n_params = sum(p.numel() for p in model.parameters())
    adapter_size = sum(p.numel() for p in model.parameters() if p.requires_grad)
    cfg = RLConfig(
        out_dir=str(tmp_path), tasks_per_step=2, group_size=2, steps=1, lr=1e-2, advantage="sign"
    )  # sign: every rollout moves the policy, even with all rewards 0
    trainer = Trainer(policy, ToyEngine(policy), TASKS, cfg, temperature=1.0)
    assert trainer.ref_model is None and trainer.ref_adapter == "reference"
    # a second adapter, not a second model: the parameter count grows by one adapter
    assert sum(p.numel() for p in model.parameters()) == n_params + adapter_size
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable
    with torch.no_grad():
        start = trainer._logprobs(model, ids, attn, mask)[0]
        torch.testing.assert_close(trainer._ref_logprobs(ids, attn, mask), start, rtol=0, atol=0)
        with model.disable_adapter():  # the pre-fine-tuning base: a different model
            base = trainer._logprobs(model, ids, attn, mask)[0]
        assert not torch.allclose(base, start, atol=1e-4)

    metrics = trainer.train_step(1)  # one real RL step: the policy moves, the reference stays
    assert metrics["loss/kl"] == pytest.approx(0.0, abs=1e-6)  # ratio 1 vs ref before update
    with torch.no_grad():
        moved = trainer._logprobs(model, ids, attn, mask)[0]
        assert not torch.allclose(moved, start, atol=1e-5)
        torch.testing.assert_close(trainer._ref_logprobs(ids, attn, mask), start, rtol=0, atol=0)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable
    assert model.active_adapter == "default"

    saved = save_policy(policy, tmp_path / "final")  # the trained adapter only
    assert not (saved / "reference").exists()
    again = load_policy(policy.config, adapter_path=saved)
    with torch.no_grad():
        reloaded = trainer._logprobs(again.model.eval(), ids, attn, mask)[0]
    torch.testing.assert_close(reloaded, moved, rtol=0, atol=1e-6)


def test_gradient_checkpointing_is_on_for_gpu_profiles_and_changes_no_gradient():
    assert PROFILES["qwen2.5-7b-instruct"].gradient_checkpointing
    assert PROFILES["llama-3.1-8b-instruct"].gradient_checkpointing
    assert not PROFILES["tiny"].gradient_checkpointing
    assert not PROFILES["qwen-shape"].gradient_checkpointing
    ids = torch.tensor([[1, 5, 9, 3, 7, 2, 4, 8]])
    out = {}
    for on in (False, True):
        policy = load_policy(ModelConfig(profile="tiny", lora=True, gradient_checkpointing=on))
        model = policy.model.train()
        assert model.base_model.model.is_activation_checkpointing == on
        model(input_ids=ids, labels=ids).loss.backward()
        out[on] = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    assert len(out[True]) == len(out[False]) > 0
    for a, b in zip(out[False], out[True], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def _bf16_lora_model():
    """A small Qwen2 in bf16 with the project's LoRA (float32 adapters), B made non-zero so
    both A and B have gradients."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from rcgrpo.models.lora import apply_lora

    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
    )
    base = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = apply_lora(base, ModelConfig(profile="qwen-shape", train_reward_rows=False), [])
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    return model


def test_bf16_lora_compute_matches_the_float32_adapter_path_within_bf16_tolerance():
    """One update's loss and LoRA gradients through training_attention (bf16 autocast, float32
    master weights, peft's input casting off) against peft's default path (inputs cast to the
    float32 adapters): equal within bf16's rounding; the adapters and their gradients stay
    float32 (AdamW's states follow them)."""
    from rcgrpo.models.lora import compute_dtype
    from rcgrpo.training.forward import training_attention
    from rcgrpo.training.grpo.update import logprobs

    model = _bf16_lora_model()
    assert compute_dtype(model) == torch.bfloat16
    ids = torch.randint(0, 64, (2, 24))
    attn = torch.ones_like(ids)
    mask = torch.zeros(2, 23)
    mask[:, 10:] = 1
    adv = torch.tensor([1.0, -0.5])

    def update(bf16: bool):
        model.zero_grad(set_to_none=True)
        ctx = training_attention(model) if bf16 else contextlib.nullcontext()
        with ctx:
            logp, _, _ = logprobs(model, ids, attn, mask)
            loss, _ = policy_loss(logp, logp.detach(), adv, mask, None)
            loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return loss.item(), logp.detach(), grads

    loss32, logp32, g32 = update(bf16=False)
    loss16, logp16, g16 = update(bf16=True)
    assert set(g16) == set(g32) and all("lora_" in n for n in g16) and len(g16) == 2 * 2 * 7
    assert all(g.dtype == torch.float32 for g in g16.values())
    assert loss16 == pytest.approx(loss32, rel=2e-2, abs=1e-3)
    assert torch.allclose(logp16, logp32, atol=5e-2)
    for n in g32:  # bf16 has 8 bits of mantissa: ~1 % per element, less over a whole tensor
        rel = (g16[n] - g32[n]).norm() / g32[n].norm()
        assert rel < 3e-2, (n, float(rel))
    # outside the training context the model runs peft's default again
    assert all(getattr(m, "cast_input_dtype_enabled", True) for m in model.modules())


class _Recorder:
    """Stands in for torch.cuda and for the vLLM servers' HTTP calls (no GPU here): records the
    order of the calls."""

    def __init__(self, log):
        self.log = log

    def synchronize(self):
        self.log.append("synchronize")

    def empty_cache(self):
        self.log.append("empty_cache")

    def set_per_process_memory_fraction(self, fraction):
        self.log.append(f"fraction {fraction:.2f}")

    def post(self, path, body):
        self.log.append(path.split("?")[0])


def test_colocated_rollouts_and_updates_take_turns_in_order(monkeypatch):
    """Through VLLMEngine.rollout with sleep mode: the trainer empties its cache and leaves
    vLLM's share BEFORE the wake-up, the rollouts run, the server sleeps, then the update gets
    the memory back."""
    from rcgrpo.rollout import colocate
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.engine import Engine
    from rcgrpo.rollout.vllm_engine import VLLMEngine

    log: list[str] = []
    monkeypatch.setattr(colocate, "_cuda", lambda: _Recorder(log))
    monkeypatch.setattr(Engine, "rollout", lambda self, *a, **k: log.append("rollouts"))
    engine = VLLMEngine.__new__(VLLMEngine)  # no server process: the stand-in records its calls
    engine.cfg = RolloutConfig(engine="vllm", vllm_sleep_mode=True, vllm_gpu_memory_utilization=0.7)
    engine.servers, engine.asleep = [_Recorder(log)], True
    engine.policy = SimpleNamespace(is_lora=False)
    engine.router = SimpleNamespace(reset=lambda: None)
    engine.rollout([])
    assert log == [
        "synchronize",
        "empty_cache",
        "fraction 0.30",
        "/wake_up",
        "rollouts",
        "/sleep",
        f"fraction {1 - colocate.VLLM_ASLEEP_SHARE:.2f}",
    ]
    assert engine.asleep


def test_sleep_mode_default_and_the_allocator_setting_stays_in_the_trainer():
    from rcgrpo.rollout import colocate
    from rcgrpo.rollout.config import RolloutConfig

    vllm = RolloutConfig(engine="vllm")
    assert colocate.sleep_mode(vllm, "qwen2.5-7b-instruct", on_cuda=True)
    assert not colocate.sleep_mode(vllm, "qwen2.5-7b-instruct", on_cuda=False)  # CPU: frees nothing
    assert not colocate.sleep_mode(vllm, "qwen-shape", on_cuda=True)  # a built-here CPU model
    two = RolloutConfig(engine="vllm", vllm_servers=2)
    assert not colocate.sleep_mode(two, "qwen2.5-7b-instruct", on_cuda=True)
    off = RolloutConfig(engine="vllm", vllm_sleep_mode=False)
    assert not colocate.sleep_mode(off, "qwen2.5-7b-instruct", on_cuda=True)
    env: dict[str, str] = {}
    colocate.trainer_allocator(env)
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert colocate.server_env({**env, "PATH": "/bin"}) == {"PATH": "/bin"}
    # a user's setting, under either name, is kept; the server gets neither
    mine = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}
    colocate.trainer_allocator(mine)
    assert mine["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:64"
    assert colocate.server_env({**mine, "PATH": "/bin"}) == {"PATH": "/bin"}


class CudaInitialised(Exception):
    """Raised by the stand-in for torch.cuda.set_device: the rl stage reached CUDA's init."""


def test_the_rl_trainer_sets_its_allocator_before_cuda_initialises(tmp_path, monkeypatch):
    """PyTorch reads PYTORCH_CUDA_ALLOC_CONF once, when CUDA initialises; in an rl rank that is
    `torch.cuda.set_device(LOCAL_RANK)` (training.distributed.local_device). run_rl runs as a
    launched rank would (WORLD_SIZE 2) up to that call, on a stand-in for it that records the
    environment there (no GPU here: the one fault we cannot cause), and stops."""
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.training.grpo.run import run_rl

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "x")  # recorded for monkeypatch to restore
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    seen = []

    def set_device(index):
        seen.append((index, os.environ.get("PYTORCH_CUDA_ALLOC_CONF")))
        raise CudaInitialised

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    (tmp_path / "start").mkdir()
    cfg = RLConfig(init_path=str(tmp_path / "start"), out_dir=str(tmp_path / "rl"), tasks_from="")
    model = ModelConfig(profile="tiny", device="auto")
    with pytest.raises(CudaInitialised):
        run_rl(cfg, model, RolloutConfig(engine="vllm"))
    assert seen == [(1, "expandable_segments:True")]


def test_allocator_settings_reach_an_allocator_that_is_already_up():
    """A trainer whose process initialised CUDA before (a stage run in the pipeline's own
    process): the settings go through PyTorch's runtime setter, read back from the allocator
    (in a fresh interpreter: the allocator's settings are process-wide)."""
    code = (
        "import os, torch\n"
        "os.environ.pop('PYTORCH_CUDA_ALLOC_CONF', None); os.environ.pop('PYTORCH_ALLOC_CONF', None)\n"
        "assert torch._C._accelerator_getAllocatorSettings() == ''  # read: nothing set\n"
        "torch.cuda.is_initialized = lambda: True  # as after an earlier stage's CUDA work\n"
        "from rcgrpo.rollout import colocate\n"
        "print(colocate.trainer_allocator())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "expandable_segments:True"


def test_a_checkpoint_copies_the_trainable_weights_to_the_host():
    """RL's rank 0 saves right after the weight sync woke its vLLM server: the copy of the
    trainable weights goes straight to host memory, never beside the server on GPU 0. Checked
    on parameters that live on a (fake) CUDA device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from rcgrpo.training.checkpoint import trainable_state

    with FakeTensorMode():
        model = torch.nn.Module()
        model.weight = torch.nn.Parameter(torch.empty(3, 4, device="cuda"))
        model.bias = torch.nn.Parameter(torch.empty(3, device="cuda"), requires_grad=False)
        state = trainable_state(model)
        assert list(state) == ["weight"]
        assert state["weight"].device.type == "cpu" and model.weight.device.type == "cuda"
