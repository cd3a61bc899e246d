"""Errors of the LLM client.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations

from worldstore.errors import WorldError


class NoModel(WorldError):
    """No model is configured. Whatever needed one did not run (status "not_run")."""


class RecordingMissing(WorldError):
    """Replay mode found no recorded answer for a request."""


class LLMCallError(WorldError):
    """The model provider refused the request or could not be reached."""
