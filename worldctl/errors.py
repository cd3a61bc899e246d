"""Errors of the command line and the web UI.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations


class PageRefused(Exception):
    """A request the web UI answers with an error page: its status and one-line message.
    Not a WorldError: the pages turn library errors into answers, and this is one."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
