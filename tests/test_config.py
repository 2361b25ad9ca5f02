"""params.yaml sections load into frozen dataclasses; typos and wrong types fail loudly."""

from dataclasses import dataclass

import pytest

from rcgrpo.config import ConfigError, load_section
from rcgrpo.fields import yaml_load


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
        ConfigError, match=r"^demo: unknown key\(s\) \['learning_rate'\].*\(.*params.yaml\)$"
    ):
        load_section("demo", Demo, path)


def test_wrong_type_and_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^demo.steps=ten: must be an int \(.*params.yaml\)$"):
        load_section("demo", Demo, write(tmp_path, "demo:\n  steps: ten\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_section("demo", Demo, write(tmp_path, "demo: [\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_section("demo", Demo, tmp_path / "nope.yaml")


def test_yaml_exponent_floats_are_floats(tmp_path):
    """YAML 1.1 (PyYAML) reads `1e-5` as a string; params.yaml means the number (YAML 1.2)."""
    path = write(tmp_path, "demo:\n  lr: 1e-5\n")
    assert load_section("demo", Demo, path).lr == 1e-5
    for text, value in [("1e-5", 1e-5), ("-2E3", -2000.0), ("1.5e+2", 150.0), (".5e1", 5.0),
                        ("1e5x", "1e5x"), ("0x10", 16), ("1_000", 1000), ("2.5", 2.5)]:  # fmt: skip
        assert yaml_load(text) == value and type(yaml_load(text)) is type(value), text


def test_list_elements_are_typed(tmp_path):
    with pytest.raises(ConfigError, match=r"^demo.targets=\[a, 1\]: must be a list of string"):
        load_section("demo", Demo, write(tmp_path, "demo:\n  targets: [a, 1]\n"))
    assert load_section("demo", Demo, write(tmp_path, "demo:\n  lr: 1\n")).lr == 1.0
