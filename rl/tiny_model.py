"""A tiny chat model built here, with nothing downloaded: for tests and CPU runs of the
training stack (``worldctl rl smoke``).

The tokenizer is byte-level BPE (``tokenizers``), so any text encodes and decodes back to
itself, wrapped in ``transformers.PreTrainedTokenizerFast`` with a Qwen/hermes-like chat
template: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, the tools as JSON lines
inside ``<tools></tools>`` in the system message, assistant tool calls as
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` and tool results as a user turn
of ``<tool_response>...</tool_response>``. The chat and tool-call markers are special
tokens (one id each). Rendering a conversation whole gives the same text as rendering each
message alone and concatenating (tools go with the first message), as verl's
MultiTurnSFTDataset checks.

By default it is trained on a few fixed strings (600 tokens), with GPT-2's pre-tokenizer.
``tiny_model`` writes a Qwen2 folder, which transformers loads as ``Qwen2Tokenizer``: the
saved vocabulary and merges behind Qwen2's own normaliser (NFC) and pre-tokenizer (its
split pattern), whatever the folder's tokenizer.json says. So the model's tokenizer is
trained the same way (``qwen2``), and on ``corpus`` too: on a pack's own first prompts
(system prompt, the 42 tool schemas, the instruction: ~32,000 characters) every piece
Qwen2's pattern cuts becomes one token, ~8,700 a prompt, where the fixed strings alone
give ~12,800.

The model (``tiny_model``) is a randomly initialised Qwen2 (``model_type`` qwen2, which
selects verl's Qwen Continuous Token builder): 2 layers, hidden size 64, 2 attention heads
of 32 (vLLM's CPU attention needs a head size of at least 32), 1 KV head, tied embeddings,
saved as safetensors in the tokenizer's folder.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import (  # type: ignore[import-untyped]
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)
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
DEFAULT_VOCAB = 600
# transformers' Qwen2Tokenizer splits text with this pattern before its byte-level BPE
QWEN2_PIECES = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
LAYERS = 2
HIDDEN = 64
HEADS = 2  # head size 32: vLLM's CPU attention needs at least 32
KV_HEADS = 1
MAX_POSITIONS = 32_768


def tiny_tokenizer(save_dir: Path | None = None, *, corpus: Iterable[str] = (),
                   vocab_size: int = DEFAULT_VOCAB,
                   qwen2: bool = False) -> PreTrainedTokenizerFast:
    """The tokenizer, trained on the fixed strings and `corpus`, with Qwen2's normaliser
    and pre-tokenizer when `qwen2` (GPT-2's otherwise); saved with ``save_pretrained``
    into `save_dir` when given (so a config can name it by path)."""
    tok = Tokenizer(models.BPE(unk_token=None))
    if qwen2:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PIECES), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS * 4 + list(corpus), trainer=trainer)
    wrap: Any = PreTrainedTokenizerFast  # untyped in transformers
    fast: PreTrainedTokenizerFast = wrap(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    if save_dir is not None:
        fast.save_pretrained(str(save_dir))
    return fast


def tiny_model(folder: Path, *, corpus: Iterable[str] = (), vocab_size: int = DEFAULT_VOCAB,
               max_positions: int = MAX_POSITIONS, seed: int = 0) -> Path:
    """A model folder verl and vLLM load: the tokenizer (``tiny_tokenizer`` with
    Qwen2's pre-tokenizer, trained on `corpus` too), a Qwen2 config and its weights,
    randomly initialised from `seed` (the same arguments give the same model)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(folder, corpus=corpus, vocab_size=vocab_size, qwen2=True)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=_token_id(tokenizer, "<|endoftext|>"),
        eos_token_id=_token_id(tokenizer, "<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        architectures=["Qwen2ForCausalLM"], dtype="bfloat16")
    torch.manual_seed(seed)
    build: Any = Qwen2ForCausalLM  # untyped in transformers
    build(config).to(torch.bfloat16).save_pretrained(str(folder))
    return folder


def _token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    found = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(found, int), f"{token} is one token"
    return found


__all__ = ["CHAT_TEMPLATE", "QWEN2_PIECES", "SPECIAL_TOKENS", "tiny_model", "tiny_tokenizer"]
