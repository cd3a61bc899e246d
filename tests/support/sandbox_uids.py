"""Uids of their own for the sandboxes of a test module, so that the processes it counts
are its alone (tests/gates/test_verifier.py and tests/gates/test_verifier_server.py), and for a host
side run as an unprivileged user (tests/hostile/test_hostile_roles.py)."""

from __future__ import annotations

import os
import pwd


def free_uid(after: int) -> int:
    """The first uid above `after` that names no user."""
    uid = after
    while True:
        uid += 1
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


def uid_processes(uid: int) -> list[int]:
    """The pids of every process of `uid`, sorted."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(int(entry))
            except OSError:
                continue
    return sorted(found)
