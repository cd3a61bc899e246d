"""Errors of evaluation (``eval/``): a run, report or comparison that is refused.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations

from worldstore.errors import WorldError


class EvalError(WorldError):
    """An evaluation that is refused: no tasks, a k below 1, a run folder made by another
    configuration, a results file that is not one, a run whose every trial was lost to
    one error. The message names the folder, file, setting or error at fault; nothing
    already written is changed."""
