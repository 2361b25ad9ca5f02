"""rcgrpo: reward-conditioned GRPO for multi-turn tool-calling agents on BFCL v4.

Importing the package does nothing but define names; entry points call
`rcgrpo.runtime.apply_defaults()` first.
"""

__version__ = "0.1.0"
