"""Errors of grading: task folders, rewards, judges.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations

from worldstore.errors import WorldError


class TaskError(WorldError):
    """A task folder that cannot be loaded. The message names the file and the field."""

    def __init__(self, message: str, *, file: str, field: str | None = None) -> None:
        self.file = file
        self.field = field
        self.reason = message
        suffix = f" (field '{field}')" if field else ""
        super().__init__(f"{file}: {message}{suffix}")


class InspectionRefused(WorldError):
    """A judge's read-only tool refused a call (unknown world or service, a statement
    other than SELECT, a path leaving the workspace, a query over its bounds)."""


class InvalidAnswer(WorldError):
    """A judge's answer that is not the required JSON."""


class RewardError(WorldError, ValueError):
    """Input that has no reward: a verifier error verdict, an empty checklist, a judge that
    did not run, a malformed rollout. A reward is never guessed for such input."""
