"""Errors of the AWM importer: files that are not AWM's format, scenarios refused.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from worldstore.errors import WorldError


class AwmError(WorldError):
    """An AWM import that is refused (an unknown --scenario name, a directory with no AWM
    file, task writing that is not available). Nothing is stored."""


class AwmFormatError(AwmError):
    """A file that is not AWM's format: a line that is not JSON, not an object, or names no
    scenario. The whole import is refused: nothing is stored."""

    def __init__(self, message: str, *, file: str, line: int | None = None) -> None:
        self.file = file
        self.line = line
        self.reason = message
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {message}")


class ScenarioRefused(AwmError):
    """A scenario that cannot be imported; each problem names its file, line and the
    scenario. Nothing is stored for the scenario; the others are unaffected (unless
    --strict)."""

    def __init__(self, scenario: str, problems: Sequence[str]) -> None:
        self.scenario = scenario
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class ExportRefused(AwmError):
    """A synthesized environment that cannot be written in AWM's formats (app code that
    uses what AWM's server has no counterpart for, a run without the stage it needs).
    Names the file and the field; nothing is written."""

    def __init__(self, message: str, *, file: str, field: str | None = None) -> None:
        self.file = file
        self.field = field
        self.reason = message
        where = f"{file}: {field}" if field is not None else file
        super().__init__(f"{where}: {message}")
