"""The one canonical encoding for everything that is hashed, and the one digest.

Canonical bytes are msgspec MessagePack with deterministic key order. MessagePack keeps
the types apart that hashing must keep apart (int / float / str / bytes / None), handles
NUL bytes in text, and encodes a whole chunk of rows in one C call. Equal content gives
equal bytes; any change gives different bytes. Digests are xxh3-128, hex.
"""

from __future__ import annotations

from typing import Any

import msgspec
import xxhash

_ENCODER = msgspec.msgpack.Encoder(order="deterministic")


def canonical_bytes(obj: Any) -> bytes:
    """Encode `obj` (dicts, lists, scalars, Structs) the one way that is hashed."""
    return _ENCODER.encode(obj)


def digest(data: bytes) -> str:
    """The content digest used for blobs, events and worlds: xxh3-128, 32 hex chars."""
    return xxhash.xxh3_128_hexdigest(data)


def digest_of(obj: Any) -> str:
    """Digest of the canonical encoding of `obj`."""
    return digest(canonical_bytes(obj))
