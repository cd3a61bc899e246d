"""Bring AWM (Agent World Model, AgentWorldModel-1K) environments into agent-worlds.

``awmbridge.formats`` reads AWM's JSON Lines files, ``awmbridge.world`` turns one scenario into day
0
of a persona's world, ``awmbridge.importer`` orchestrates a directory (``worldctl import-awm``),
``awmbridge.tasks`` writes task folders for the scenario's tasks. The tools are served by the
AWM adapter app in ``worldenv/awm/host.py``.
"""
