"""rcgrpo: reward-conditioned GRPO for multi-turn tool-calling agents on BFCL v4.

The packages are the pipeline's stages, bottom to top: bfcl -> chat -> models -> rollout -> envs ->
data -> training -> evaluation -> tracking; each may import from its own layer and the ones below (the
top-level runtime, config and servers modules are below them all); flows/ and cli/ sit on top.
tests/test_layout.py checks it. Importing the package does nothing but define names; entry points
call `rcgrpo.runtime.apply_defaults()` first.
"""

__version__ = "0.1.0"
