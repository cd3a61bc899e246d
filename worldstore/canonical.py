"""The one canonical encoding for everything that is hashed, and the one digest.

Canonical bytes are msgspec MessagePack with deterministic key order. MessagePack keeps
the types apart that hashing must keep apart (int / float / str / bytes / None), handles
NUL bytes in text, and encodes a whole chunk of rows in one C call. Equal content gives
equal bytes; any change gives different bytes. Digests are xxh3-128, hex.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import xxhash

_ENCODER = msgspec.msgpack.Encoder(order="deterministic")


# Encode an object (dicts, lists, scalars, Structs) the one way that is hashed. The
# encoder's own method, not a wrapper: per-day hashing encodes rows one at a time.
canonical_bytes: Callable[[Any], bytes] = _ENCODER.encode


def array_header(length: int) -> bytes:
    """The bytes that open a MessagePack array of `length` items: ``canonical_bytes`` of a
    list is this followed by each item's ``canonical_bytes``, so a list's encoding can be
    assembled from its items' (per-day hashing keeps rows encoded one by one)."""
    if length < 16:
        return bytes((0x90 | length,))
    if length < 1 << 16:
        return b"\xdc" + length.to_bytes(2, "big")
    return b"\xdd" + length.to_bytes(4, "big")


def digest(data: bytes) -> str:
    """The content digest used for blobs, events and worlds: xxh3-128, 32 hex chars."""
    return xxhash.xxh3_128_hexdigest(data)


def digest_of(obj: Any) -> str:
    """Digest of the canonical encoding of `obj`."""
    return digest(canonical_bytes(obj))
