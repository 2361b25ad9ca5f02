"""What a tool observation may be before it reaches the model: valid UTF-8 text of bounded size.

A tool can return any str (an error message that quotes a lone surrogate such as `'\\ud800'`, a
file the model wrote with one), and a tokenizer raises on text that is not valid UTF-8, which
would end a whole rollout batch. Lone surrogates are therefore written as their escape
(`\\ud800`), in the worker and in the parent alike, so the live episode and the scoring replay
see the same text.

Size: cheap calls can build an answer of any size (a directory `cp` in BFCL's file system shares
children, so paths double per level: 73 calls, then `find`, returned 53 MB in 0.4 s, and the
parent then spent 197 s and 16.9 GB tokenizing it). Every observation is therefore cut to
`env.max_observation_chars` where it is made, in the tool worker, with a "[truncated N chars]"
marker. The default, 32,768, is above every ground-truth observation of the 800 tasks (max
31,706 chars, p99 12,690: `.venv/bin/python scripts/observation_sizes.py`), so no task's
intended answer is cut. Live episodes and scoring replays run the same `LocalEpisode.step`, so
both see the same cut text.

    .venv/bin/pytest tests/test_reward_hacking.py -q -k observation
"""

from __future__ import annotations

DEFAULT_MAX_CHARS = 32_768  # env.max_observation_chars's default (rcgrpo.envs.config.EnvConfig)
_max_chars = DEFAULT_MAX_CHARS  # this process's cap; a tool worker's comes from its argv


def set_max_chars(n: int) -> None:
    """This process's cap (the sandbox worker sets env.max_observation_chars at start)."""
    global _max_chars
    _max_chars = int(n)


def valid_utf8(text: str) -> str:
    """`text` with every lone surrogate replaced by its backslash escape (else unchanged)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def shown(text: str) -> str:
    """What the model is shown of one observation: at most the cap's characters of it, then
    "[truncated N chars]" naming what was left out, as valid UTF-8."""
    if len(text) > _max_chars:
        left = len(text) - _max_chars
        text = f"{text[:_max_chars]}\n[truncated {left} chars]"
    return valid_utf8(text)
