"""Errors of training (``rl/``): a dataset, warm start or launch config that is refused.

The whole tree is drawn in ``worldstore/errors.py``.
"""

from __future__ import annotations

from worldstore.errors import WorldError


class RLError(WorldError):
    """A training input that is refused: an unknown or empty split, a task whose world is
    not in the store, no successful trajectory to warm-start on, an unknown preset. The
    message names the pack, split, task or setting at fault; nothing is written."""


class RolloutLost(RLError):
    """A rollout lost to the infrastructure: its instance could not open, the verifier or
    the model server failed. The agent loop retries it on a fresh instance and reports it
    lost (``env_error``, reward 0, nothing trained) after the last try; never a crash."""
