"""What a tool observation may be before it reaches the model: valid UTF-8 text.

A tool can return any str (an error message that quotes a lone surrogate such as `'\ud800'`, a
file the model wrote with one), and a tokenizer raises on text that is not valid UTF-8, which
would end a whole rollout batch. Lone surrogates are therefore written as their escape
(`\\ud800`), in the worker and in the parent alike, so the live episode and the scoring replay
see the same text.

    .venv/bin/pytest tests/test_reward_hacking.py -q
"""

from __future__ import annotations


def valid_utf8(text: str) -> str:
    """`text` with every lone surrogate replaced by its backslash escape (else unchanged)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
