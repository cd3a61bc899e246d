"""Which backend: the one ``WORLDCTL_SANDBOX`` names (only ``container``, inside a
container), else bubblewrap where it works, else Docker where an engine answers; probed
once and cached."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from pathlib import Path

from worldenv.errors import SandboxError
from worldenv.sandbox.bubblewrap import BubblewrapSandbox
from worldenv.sandbox.container import ContainerSandbox
from worldenv.sandbox.contract import Limits, Sandbox, ShellResult
from worldenv.sandbox.docker import DockerSandbox
from worldenv.sandbox.policy import chosen_backend, give_tree, sandbox_ids

__all__ = ["default_sandbox", "give_to_sandbox", "run_sandboxed"]

log = logging.getLogger(__name__)


def _bwrap_works() -> tuple[BubblewrapSandbox | None, str]:
    try:
        box = BubblewrapSandbox()
    except SandboxError as exc:
        return None, str(exc)
    probe = Path(tempfile.mkdtemp(prefix="agentworlds-sandbox-probe-"))
    try:
        result = box.run("echo ok", probe, Limits(timeout_s=20))
    except (OSError, SandboxError) as exc:
        return None, f"bubblewrap failed: {exc}"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if result.exit_code == 0 and result.stdout.strip() == "ok":
        return box, ""
    return None, f"bubblewrap failed (exit {result.exit_code}): {result.stderr.strip()[:500]}"


@functools.cache
def default_sandbox() -> Sandbox:
    """The backend ``WORLDCTL_SANDBOX`` names (``container``: this container is the
    sandbox; refused outside one), else bubblewrap if it works here, else Docker if an
    engine answers; probed once. The container backend is never chosen by the probe."""
    if chosen_backend() == "container":
        return ContainerSandbox()
    box, why = _bwrap_works()
    if box is not None:
        return box
    docker = DockerSandbox()
    if docker.engine_answers():
        if not docker.image_present():
            raise SandboxError(
                f"bubblewrap is unusable ({why}), and the Docker sandbox's image "
                f"{docker.image} is not built: run deploy/build-base.sh (as root) from the "
                "checkout, or set WORLDCTL_SANDBOX_IMAGE")
        log.warning("bubblewrap is unusable (%s); using Docker", why)
        return docker
    raise SandboxError(
        f"no sandbox for shell commands: {why}; and no Docker engine answers `docker info`. "
        "Install bubblewrap (apt-get install bubblewrap util-linux; unprivileged user "
        "namespaces must be enabled) or run a Docker engine.")


def run_sandboxed(command: str, workspace: Path, limits: Limits | None = None) -> ShellResult:
    """Run `command` with `default_sandbox()`."""
    return default_sandbox().run(command, workspace, limits)


def give_to_sandbox(path: Path) -> None:
    """Make a scratch tree writable by the sandbox user (as root, chown it to that uid;
    otherwise the sandbox runs as the caller, who owns it already). Only for trees this
    process made for one run, never for a user's own files."""
    if os.geteuid() == 0:
        give_tree(Path(os.path.realpath(path)), *sandbox_ids())
