"""`rcgrpo ARGS...` in a process that may not load a model or initialise CUDA: the flow's own.

Every import of torch, transformers, peft, accelerate or rcgrpo.models.loading in this process
(never in the stage processes it starts) is written to $FLOW_GUARD_LOG with where it came from,
and refused with an ImportError, so a model load or a CUDA call reached here fails the run. Used
by tests/test_pipeline_e2e.py:

    FLOW_GUARD_LOG=guard.log python tests/flow_guard.py run --profile tiny --set rl.steps=2
"""

from __future__ import annotations

import importlib.abc
import os
import sys
import traceback

FORBIDDEN = ("torch", "transformers", "peft", "accelerate", "rcgrpo.models.loading")


class Guard(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
            stack = [f for f in traceback.extract_stack()[:-1] if "importlib" not in f.filename]
            where = [f"{f.filename}:{f.lineno}" for f in stack[-8:]]
            with open(os.environ["FLOW_GUARD_LOG"], "a") as log:
                log.write(f"{name} from {' <- '.join(reversed(where))}\n")
            raise ImportError(f"flow guard: {name} imported in the flow's own process")
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, Guard())
    from rcgrpo.cli import main

    sys.argv = ["rcgrpo", *sys.argv[1:]]
    main()
