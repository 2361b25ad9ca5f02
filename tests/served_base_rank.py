"""A torchrun rank that asks for the served base of the tiny LoRA policy as a vLLM engine does
(rcgrpo.models.serving.base_for), and writes what it got to <out>/rank_<RANK>.json; the run's
or node's folder from the environment its launcher gave it, else its own under <own>/rank_<RANK>.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/served_base_rank.py OUT OWN
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rcgrpo.models.loading import load_policy
from rcgrpo.models.profiles import ModelConfig
from rcgrpo.models.serving import DONE, base_for, served_root

if __name__ == "__main__":
    out, own = Path(sys.argv[1]), Path(sys.argv[2])
    rank = os.environ["RANK"]
    policy = load_policy(ModelConfig(profile="tiny", device="cpu", lora=True, lora_r=8))
    folder = base_for(policy, own / f"rank_{rank}")
    said = {"folder": str(folder), "root": str(served_root()), "done": (folder / DONE).exists()}
    (out / f"rank_{rank}.json").write_text(json.dumps(said))
