"""Prompt pieces and the one renderer shared by rollouts and SFT: messages -> token pieces.

An environment writes its own system prompt and requests (rcgrpo.envs); what is here is the
same for all: the reward goal, tool docs as the template lists them, tools revealed mid-episode,
calls as a python list, the chat template.

Rollouts and SFT examples are built from the same pieces, so a recorded trajectory trains on the
layout the policy sees when it acts:

    prompt        system (+ tools) + first user message (+ reward goal) + generation prompt  mask 0
    assistant     the message text + the end-of-message token (e.g. <|im_end|>)              mask 1
    continuation  what the template puts between two assistant messages: the rest of the
                  assistant suffix ("\\n"), tool observations, the next user turn, and the
                  next generation prompt                                                      mask 0

A continuation is the text the chat template adds when the new messages are appended (template
rendering of all messages minus the rendering up to the last assistant message), so any chat
template that renders a conversation as a concatenation of messages works, the model's own ones
included. Calls are written in python form, `[cd(folder='document'), ls()]`.

Tool output is data: a tool message whose text contains the text of any added token (special
or not: `<|im_end|>`, `<|high_reward|>`, Qwen's `<tool_call>` ...) or of a tag the chat template
writes itself (`<tool_response>`, `</tool_response>`, `<tools>` ...) is rendered with a
backslash after its first character (`<\\|im_end|>`, `<\\/tool_response>`), so it tokenises as
plain text and can neither end a message or its tool block nor set the reward goal. The stored
messages keep the raw text; only the rendering escapes.

    .venv/bin/pytest tests/test_agent_loop.py -q
"""

from __future__ import annotations

import re

from rcgrpo.chat.record import HIGH, LOW

# ChatML with a tools block. A tool is rendered as its `signature` line when it has one (the
# compact docs of the tiny profile) and as JSON otherwise. Content is never trimmed: the text of
# an assistant message is exactly the decoded sampled ids.
PROJECT_TEMPLATE = (
    "{%- if tools and (not messages or messages[0].role != 'system') %}"
    "{{- '<|im_start|>system\\n# Tools\\n' }}"
    "{%- for tool in tools %}{%- set f = tool.function if tool.function is defined else tool %}"
    "{{- (f.signature if f.signature is defined else (f | tojson)) + '\\n' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
    "{%- if loop.first and message.role == 'system' and tools %}"
    "{{- '\\n\\n# Tools\\n' }}"
    "{%- for tool in tools %}{%- set f = tool.function if tool.function is defined else tool %}"
    "{{- (f.signature if f.signature is defined else (f | tojson)) + '\\n' }}{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

NEW_FUNCTIONS_HEADER = "\n\nNew functions:\n"


def reward_goal(token: str) -> str:
    """The conditioning text appended to the first user message (the paper's literal form)."""
    if token not in (HIGH, LOW):
        raise ValueError(f"reward token must be {HIGH!r} or {LOW!r}, got {token!r}")
    return f"[Reward Goal: {token}]"


def with_reward_goal(content: str, token: str | None) -> str:
    return content if token is None else f"{content}\n{reward_goal(token)}"


def compact_signature(doc: dict) -> str:
    """One line per function, e.g. `mv(source: string, destination: string, overwrite?: boolean)`
    (`?` = optional). Description-free: the tiny profile's prompt budget is small."""
    params = doc.get("parameters", {})
    required = set(params.get("required", []))
    parts = [
        f"{name}{'' if name in required else '?'}: {spec.get('type', 'any')}"
        for name, spec in params.get("properties", {}).items()
    ]
    return f"{doc['name']}({', '.join(parts)})"


def tool_entries(docs: list[dict], compact: bool) -> list[dict]:
    """The `tools=` list for the chat template: OpenAI-style function entries; compact ones carry
    a `signature` line the project template prints instead of the JSON."""
    return [
        {"type": "function", "function": {**doc, "signature": compact_signature(doc)}}
        if compact
        else {"type": "function", "function": doc}
        for doc in docs
    ]


def tools_text(docs: list[dict], compact: bool) -> str:
    """Tool docs as plain text, for functions revealed mid-episode (miss_func): the system prompt
    cannot change under token-in-token-out, so they come in the reveal user message."""
    import json

    return "\n".join(compact_signature(d) if compact else json.dumps(d) for d in docs)


def format_calls(calls: list[str]) -> str:
    """Assistant text for a list of call strings (how expert steps are written)."""
    return "[" + ", ".join(calls) + "]"


class Renderer:
    """Messages -> token ids through one chat template (the tokenizer's `chat_template`).

    stop_id: the end-of-message token the model samples to end an assistant message (the one
    the template writes); also_stop: other tokens that end a sampled message (Llama 3.1's
    <|eom_id|> after a tool call); `stop_ids` holds them all.
    """

    def __init__(self, tokenizer, stop_id: int, also_stop: tuple[int, ...] = ()):
        self.tokenizer = tokenizer
        self.stop_id = stop_id
        self.stop_ids = (stop_id, *also_stop)
        self.stop_text = tokenizer.convert_ids_to_tokens(stop_id)
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        head = self.text(probe, None, True)
        full = self.text([*probe, {"role": "assistant", "content": "PROBE"}], None, False)
        suffix = full[len(head) :]
        if not full.startswith(head) or not suffix.startswith("PROBE" + self.stop_text):
            raise ValueError(
                f"chat template does not end an assistant message with {self.stop_text!r} "
                f"(rendered {suffix!r}): pick the project template (models.PROJECT_TEMPLATE)"
            )
        self.after_stop = suffix[len("PROBE" + self.stop_text) :]  # e.g. "\n" in ChatML
        # Every added token becomes one id whatever its `special` flag (Qwen2.5's <tool_call> is
        # not special), and a tag the template writes (<tool_response>) marks structure even
        # when it tokenises as several pieces: a tool text must spell neither.
        added = getattr(tokenizer, "added_tokens_decoder", {}).values()
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
        tags = re.findall(r"</?[A-Za-z_|][\w|.-]*>", template)
        specials = {*tokenizer.all_special_tokens, *(t.content for t in added), *tags}
        self.specials = sorted((t for t in specials if len(t) > 1), key=len, reverse=True)
        # the most characters one token can stand for (a byte-level BPE token's string holds
        # one character per byte): a text of n characters is at least n / this many tokens
        self.longest_token = max(len(t) for t in tokenizer.get_vocab())

    def escape(self, content: str) -> str:
        """Tool text with every added token's and template tag's text broken by a backslash."""
        for _ in range(8):  # an escape never forms a new special text; the bound is a guard
            found = [t for t in self.specials if t in content]
            if not found:
                break
            for t in found:
                content = content.replace(t, t[0] + "\\" + t[1:])
        return content

    def text(self, messages: list[dict], tools: list[dict] | None, generation: bool) -> str:
        messages = [
            {**m, "content": self.escape(m["content"])}
            if m.get("role") == "tool" and isinstance(m.get("content"), str)
            else m
            for m in messages
        ]
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def prompt(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """Ids of the conversation so far plus the assistant generation prompt."""
        return self.encode(self.text(messages, tools, True))

    def continuation(
        self, history: list[dict], new: list[dict], tools: list[dict] | None, generation: bool
    ) -> list[int]:
        """Ids the template adds after the last assistant message of `history` (whose end token
        is already in the sequence) when `new` messages follow (+ the generation prompt)."""
        before = self.text(history, tools, False)
        after = self.text([*history, *new], tools, generation)
        if not after.startswith(before):
            raise ValueError("chat template re-renders earlier messages: not token-exact")
        return self.encode(self.after_stop + after[len(before) :])
