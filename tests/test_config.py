"""params.yaml sections load into frozen dataclasses; typos and wrong types fail loudly."""

from dataclasses import dataclass

import pytest

from rcgrpo.config import ConfigError, load_section


@dataclass(frozen=True)
class Demo:
    lr: float = 1e-5  # learning rate
    steps: int = 10  # optimizer steps
    mode: str = "rc"  # conditioning
    targets: tuple[str, ...] = ("q_proj",)  # LoRA target modules


def write(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_section_with_overrides(tmp_path):
    path = write(tmp_path, "demo:\n  lr: 0.001\n  steps: 3\n  targets: [a, b]\n")
    cfg = load_section("demo", Demo, path, overrides={"mode": "none"})
    assert cfg == Demo(lr=0.001, steps=3, mode="none", targets=("a", "b"))
    assert load_section("absent", Demo, path) == Demo()


def test_unknown_key_names_file_section_and_allowed_keys(tmp_path):
    path = write(tmp_path, "demo:\n  learning_rate: 0.1\n")
    with pytest.raises(
        ConfigError, match=r"params.yaml:demo: unknown key\(s\) \['learning_rate'\]"
    ):
        load_section("demo", Demo, path)


def test_wrong_type_and_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"demo.steps: 'ten' is not a <class 'int'>"):
        load_section("demo", Demo, write(tmp_path, "demo:\n  steps: ten\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_section("demo", Demo, write(tmp_path, "demo: [\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_section("demo", Demo, tmp_path / "nope.yaml")
