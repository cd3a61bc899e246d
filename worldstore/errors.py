"""The one error tree of agent-worlds.

    WorldError                      every error the project raises on purpose
    ├── InputError                  bad interchange input; names file, line and field
    ├── PathError                   a workspace path that is absolute, has '..', or escapes
    ├── ApplyError                  an event that failed to apply; names persona, day, event
    ├── StoreError                  event-store problems
    │   ├── ConflictError           a racing append to the same persona; nothing written
    │   ├── DayOrderError           a day that exists already or is not after the last one
    │   ├── StoreVersionError       the store's schema is newer than this code
    │   └── NotFoundError           unknown persona, day, hash or blob
    ├── IntegrityError              stored data that does not match its own hashes
    ├── WorldDirError               a directory that is not a world (bad layout)
    ├── SandboxError                no usable sandbox, or a command it cannot run
    ├── TaskError                   a task folder that does not load; names file and field
    └── ConfigError                 invalid configuration (e.g. difficulty intervals)

Driver errors (sqlite3, psycopg, apsw) are translated in one place per adapter;
nothing outside those adapters catches a driver error.
"""

from __future__ import annotations


class WorldError(Exception):
    """Base of every error agent-worlds raises on purpose."""


class InputError(WorldError):
    """Bad interchange input. The message names the file, the line and the field."""

    def __init__(
        self, message: str, *, file: str | None = None, line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.reason = message
        where = ":".join(str(p) for p in (file, line) if p is not None)
        prefix = f"{where}: " if where else ""
        suffix = f" (field '{field}')" if field else ""
        super().__init__(f"{prefix}{message}{suffix}")


class PathError(WorldError):
    """A workspace path that is absolute, contains '..' or leaves the workspace."""


class ApplyError(WorldError):
    """An event failed to apply; the whole persona-day is refused."""

    def __init__(
        self, message: str, *, persona: str, day: int, index: int, line: int | None = None,
        source: str | None = None,
    ) -> None:
        self.persona = persona
        self.day = day
        self.index = index
        self.line = line
        self.reason = message
        where = f"{source}:{line}: " if source and line else (f"line {line}: " if line else "")
        super().__init__(
            f"{where}{persona}@{day} event #{index} refused, the whole day is not stored: {message}"
        )


class StoreError(WorldError):
    """A problem with the event store itself."""


class ConflictError(StoreError):
    """Another writer appended to the same persona first. Nothing was written."""


class DayOrderError(StoreError):
    """A day that already exists, or that is not after the persona's last day."""


class StoreVersionError(StoreError):
    """The store was written by newer code; this code refuses to touch it."""


class NotFoundError(StoreError):
    """An unknown persona, day, world hash or blob."""


class IntegrityError(WorldError):
    """Stored data does not match its own hashes (tampering or corruption)."""


class WorldDirError(WorldError):
    """A directory that does not have the layout of a world."""


class SandboxError(WorldError):
    """No usable sandbox (bubblewrap or Docker), or a command or workspace it refuses."""


class TaskError(WorldError):
    """A task folder that cannot be loaded. The message names the file and the field."""

    def __init__(self, message: str, *, file: str, field: str | None = None) -> None:
        self.file = file
        self.field = field
        self.reason = message
        suffix = f" (field '{field}')" if field else ""
        super().__init__(f"{file}: {message}{suffix}")


class ConfigError(WorldError):
    """Configuration that cannot work (checked at start-up, before anything runs)."""
