"""vLLM's --max-lora-rank for an adapter: rounded up to a rank vLLM accepts, never a value the
server refuses at start (an r=12 adapter used to start a server with --max-lora-rank 12).

    .venv/bin/pytest tests/test_lora_rank.py -q
"""

import json
import subprocess

import pytest

from rcgrpo.rollout.config import VLLM_LORA_RANKS, RolloutConfig


@pytest.mark.parametrize(("lora_r", "served"), [(1, 1), (4, 8), (12, 16), (16, 16), (100, 128)])
def test_the_adapter_rank_is_rounded_up_to_an_accepted_one(lora_r, served):
    assert RolloutConfig().served_lora_rank(lora_r) == served


def test_an_explicit_rank_wins_and_a_rank_above_vllms_largest_is_one_line():
    assert RolloutConfig(vllm_max_lora_rank=64).served_lora_rank(16) == 64
    with pytest.raises(ValueError, match="above vLLM's largest, 512"):
        RolloutConfig().served_lora_rank(600)


def test_the_accepted_ranks_are_the_installed_vllms():
    from rcgrpo.rollout.vllm_venv import ensure_venv

    code = "import typing, vllm.config.lora as L; import json; print(json.dumps(typing.get_args(L.MaxLoRARanks)))"
    out = subprocess.run(
        [str(ensure_venv()), "-c", code], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert tuple(json.loads(out.stdout.strip().splitlines()[-1])) == VLLM_LORA_RANKS
