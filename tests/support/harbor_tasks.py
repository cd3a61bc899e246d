"""Helpers of the Harbor tests (tests/packs/test_harbor*.py): a folder's files as
comparable data, and the script Harbor's own venv runs to load exported tasks with
Harbor's own models."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def tree(root: Path) -> list[tuple[str, str, int]] | None:
    """Every file under `root` as (path, sha256, mode bits), sorted; folders as
    (path, "dir", mode); None if `root` does not exist."""
    if not root.exists():
        return None
    found = []
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        kind = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        found.append((path.relative_to(root).as_posix(), kind, st.st_mode & 0o777))
    return found


# Run by the harbor venv's Python with the folder of exported tasks as argv[1]: loads
# each with harbor.models.task.task.Task (which validates task.toml with TaskConfig and
# the folder layout) and prints, as JSON, what the test compares.
HARBOR_LOADER = r"""
import json, sys
from pathlib import Path
from harbor.models.task.task import Task

seen = {}
for folder in sorted(Path(sys.argv[1]).iterdir()):
    task = Task(folder)
    config = task.config
    seen[folder.name] = {
        "valid": Task.is_valid_dir(folder),
        "name": task.name,
        "instruction": task.instruction,
        "solve": task.paths.discovered_solve_path.name,
        "test": task.paths.discovered_test_path.name,
        "mcp": [s.model_dump(exclude={"url", "headers"}) for s in
                config.environment.mcp_servers],
        "metadata": config.metadata,
        "workdir": config.environment.workdir,
        "verifier_timeout": config.verifier.timeout_sec,
    }
print(json.dumps(seen))
"""
