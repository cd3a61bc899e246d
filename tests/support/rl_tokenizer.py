"""The tiny chat tokenizer of the training tests: ``rl.tiny_model``'s, built here with no
download (byte-level BPE on a few strings, a Qwen/hermes-like chat template)."""

from __future__ import annotations

from rl.tiny_model import CHAT_TEMPLATE, SPECIAL_TOKENS, tiny_tokenizer

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "tiny_tokenizer"]
