"""Errors of synthesis: runs and inputs that are refused, budgets that are spent.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations

from worldstore.errors import WorldError


class SynthError(WorldError):
    """A synthesis run or input that is refused (a seeds or scenarios file that is not the
    format, naming file and line; an unknown stage; a run folder made with other options;
    a replay that differs from its run). Nothing stored is changed."""


class BudgetSpent(SynthError):
    """The run's token or cost budget is spent. The stage that asked for one more call is
    not finished (nothing of it is kept as done); the run resumes where it stopped."""
