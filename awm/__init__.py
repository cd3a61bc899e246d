"""Bring AWM (Agent World Model, AgentWorldModel-1K) environments into agent-worlds.

``awm.formats`` reads AWM's JSON Lines files, ``awm.world`` turns one scenario into day 0
of a persona's world, ``awm.importer`` orchestrates a directory (``worldctl import-awm``),
``awm.tasks`` writes task folders for the scenario's tasks. The tools are served by the
AWM adapter app in ``envs/awm.py``.
"""
