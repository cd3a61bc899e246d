"""A tiny chat tokenizer for the training tests, built here with no download.

Byte-level BPE (``tokenizers``) trained on a few strings, so any text encodes and decodes
back to itself, wrapped in ``transformers.PreTrainedTokenizerFast`` with a Qwen/hermes-like
chat template: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, the tools as JSON
lines inside ``<tools></tools>`` in the system message, assistant tool calls as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` and tool results as a user turn
of ``<tool_response>...</tool_response>``. The chat and tool-call markers are special
tokens (one id each).

Rendering a conversation whole gives the same text as rendering each message alone and
concatenating (tools go with the first message), as verl's MultiTurnSFTDataset checks.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "<think>", "</think>"]

CHAT_TEMPLATE = (
    "{%- set nl = '\\n' -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system' + nl }}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{{ messages[0].content + nl + nl }}"
    "{%- endif -%}"
    "{{ '# Tools' + nl + '<tools>' }}"
    "{%- for tool in tools -%}{{ nl }}{{ tool | tojson }}{%- endfor -%}"
    "{{ nl + '</tools><|im_end|>' + nl }}"
    "{%- elif messages and messages[0].role == 'system' -%}"
    "{{ '<|im_start|>system' + nl + messages[0].content + '<|im_end|>' + nl }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{%- if not loop.first -%}"
    "{{ '<|im_start|>system' + nl + message.content + '<|im_end|>' + nl }}"
    "{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant' + nl + (message.content or '') }}"
    "{%- for call in (message.tool_calls or []) -%}"
    "{{ '<tool_call>' + nl + '{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{%- if call.function.arguments is string -%}{{ call.function.arguments }}"
    "{%- else -%}{{ call.function.arguments | tojson }}{%- endif -%}"
    "{{ '}' + nl + '</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>' + nl }}"
    "{%- elif message.role == 'tool' -%}"
    "{{ '<|im_start|>user' + nl + '<tool_response>' + nl + message.content + nl"
    " + '</tool_response><|im_end|>' + nl }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + nl + message.content + '<|im_end|>' + nl }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant' + nl }}{%- endif -%}"
)

_CORPUS = [
    "You are an agent working on a user's personal computer.",
    "Run a bash command in the workspace folder; call answer when you are done.",
    '{"type": "function", "function": {"name": "shell", "arguments": {"command": "ls"}}}',
    "chat_search_messages shop_get_order notes_search_notes calendar_list_events",
    "The quick brown fox jumps over the lazy dog 0123456789 æøå ÆØÅ",
]


def tiny_tokenizer(save_dir: Path | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer; saved with ``save_pretrained`` into `save_dir` when given (so a
    config can name it by path)."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    if save_dir is not None:
        fast.save_pretrained(str(save_dir))
    return fast


__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "tiny_tokenizer"]
