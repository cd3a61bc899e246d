"""Errors of domain packs: a pack folder that does not load, an archive that is refused.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations

from worldstore.errors import WorldError


class PackError(WorldError):
    """A pack (folder, pack.json, splits, archive) that is refused. The message names the
    pack, the file and the field or persona-day at fault."""

    def __init__(self, message: str, *, file: str | None = None,
                 field: str | None = None) -> None:
        self.file = file
        self.field = field
        self.reason = message
        prefix = f"{file}: " if file else ""
        suffix = f" (field '{field}')" if field else ""
        super().__init__(f"{prefix}{message}{suffix}")
