"""Where the tool calls sit in a model message: inside `<tool_call>...</tool_call>` tags, inside a
code fence, or in text that starts like a call. rcgrpo.bfcl.executor parses what these find.

Why no regex for the tags and the fence: as `<tool_call>(.*?)</tool_call>` and
"^```[a-zA-Z]*\\s*\\n?(.*?)\\n?```$" they were quadratic: every opening tag without a closing one,
and every way of splitting a fenced run of newlines without a closing fence, rescanned the rest
of the message (one of 1,003 newline tokens cost 42 s of CPU). str.find and slicing are linear.

    .venv/bin/pytest tests/test_executor.py -q
"""

from __future__ import annotations

import re
import string

OPEN, CLOSE, FENCE = "<tool_call>", "</tool_call>", "```"
# Text that tries to call something: it starts like `name(`, `a.b[0](`, `[`, `(`, `{"name"`,
# `import`, or it touches a dunder anywhere. Such text gets an error observation when it is not
# a valid call; plain prose ("The file is moved.") is an answer, not an attempt. Linear: each
# bracket group ends at its first `]`, each dotted part at the next dot.
_CALL_START = re.compile(
    r'^\s*([\[(]|\{\s*"(name|function)"|import\s|from\s+\w+\s+import\s'
    r"|[A-Za-z_]\w*(\.\w+|\[[^\]]*\])*\s*\()"
)


def looks_like_a_call(text: str) -> bool:
    return bool(_CALL_START.match(text)) or "__" in text


def tagged(text: str) -> list[str]:
    """What each `<tool_call>...</tool_call>` pair holds, left to right."""
    found, pos = [], 0
    while (start := text.find(OPEN, pos)) >= 0:
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:  # no later opening tag can be closed either
            break
        found.append(text[start + len(OPEN) : end])
        pos = end + len(CLOSE)
    return found


def unfenced(text: str) -> str | None:
    """The inside of a (stripped) text fenced as ```lang ... ```, stripped; None if unfenced."""
    if len(text) < 2 * len(FENCE) or not (text.startswith(FENCE) and text.endswith(FENCE)):
        return None
    inside = text[len(FENCE) : -len(FENCE)]
    return inside.lstrip(string.ascii_letters).strip()  # the language tag, then the blanks
