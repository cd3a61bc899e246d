"""Errors of the environments: sandboxes, instances, app workers, the gateway.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations

from typing import Any

from fastmcp.exceptions import ToolError as McpToolError

from worldstore.errors import WorldError


class ToolError(McpToolError):
    """A tool's refusal (a missing row, a bad state, ...), raised by app code: the agent
    sees its message verbatim as an error result. Not a WorldError: it never leaves the
    tool call. It is FastMCP's ToolError too, so any FastMCP server serving an app's tools
    passes the message on as the same refusal."""


class SandboxError(WorldError):
    """No usable sandbox (bubblewrap or Docker), or a command or workspace it refuses."""


class InstanceClosed(WorldError):
    """A call on an instance that was closed."""


class AppPinError(WorldError):
    """A world pins app code that this installation cannot serve."""


class ResetNeeded(WorldError):
    """step() was called before reset() or after the episode ended."""


class AppLoadError(WorldError):
    """Carried app code that the worker could not load."""


class WorkerError(WorldError):
    """The worker timed out, died or answered nonsense."""


class GatewayError(WorldError):
    """The gateway refuses a configuration (an open bind without a token, bad limits)."""


class BrowserError(WorldError):
    """The instances' browser could not start, stopped, or did not answer in time."""


class ActionError(ValueError):
    """An action object that is not one of the protocol's shapes: a program's misuse of
    Gym, REST or OpenEnv. A model's malformed call is an observation, never this."""


class HttpError(Exception):
    """A request a network surface refuses: its status, the one-line message, headers and
    extra fields of the JSON answer (a cap's name and limit). Not a WorldError, so no
    ``except WorldError`` that turns library errors into answers catches it again."""

    def __init__(self, status: int, message: str,
                 headers: list[tuple[bytes, bytes]] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []
        self.extra = extra or {}
