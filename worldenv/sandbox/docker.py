"""The Docker backend: one throw-away container per command, used where bubblewrap is
unusable and an engine answers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from worldenv.sandbox.contract import Bind, Limits, Sandbox, ShellResult
from worldenv.sandbox.policy import (
    MAX_OPEN_FILES,
    MOUNT_AT,
    check_binds,
    check_command,
    check_workspace,
    give_tree,
    sandbox_env,
    sandbox_ids,
)
from worldenv.sandbox.supervise import shell_result, supervise

__all__ = ["DockerSandbox"]


class DockerSandbox(Sandbox):
    """The ``docker`` CLI against a running engine; one throw-away container per command."""

    name = "docker"

    def __init__(self, image: str = "python:3.11-slim", *, docker: str = "docker",
                 cpus: float = 1.0) -> None:
        self.image = image
        self.docker = docker
        self.cpus = cpus

    def build_argv(self, command: str, workspace: Path, limits: Limits, container: str,
                   env: Mapping[str, str] | None = None, user: tuple[int, int] | None = None,
                   binds: Sequence[Bind] = ()) -> list[str]:
        argv = [
            self.docker, "run", "--rm", "--name", container,
            "--network", "none",
            "--memory", f"{limits.memory_mib}m", "--memory-swap", f"{limits.memory_mib}m",
            "--pids-limit", str(limits.max_procs),
            "--cpus", str(self.cpus),
            "--read-only",
            "--tmpfs", f"/tmp:rw,nosuid,nodev,size={limits.tmp_mib}m",
            "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges",
            "--init",
            "--ulimit", f"cpu={limits.cpu_s}:{limits.cpu_s + 1}",
            "--ulimit", f"fsize={limits.max_file_mib << 20}",
            "--ulimit", f"nofile={MAX_OPEN_FILES}:{MAX_OPEN_FILES}",
            "--ulimit", "core=0",
        ]
        if user is not None:
            argv += ["--user", f"{user[0]}:{user[1]}"]
        argv += (["-v", f"{workspace}:{MOUNT_AT}:rw"] if limits.workspace_mib is None else
                 ["--tmpfs", f"{MOUNT_AT}:rw,nosuid,nodev,size={limits.workspace_mib}m"])
        argv += ["-w", MOUNT_AT]
        for bind in binds:
            argv += ["-v", f"{bind.source}:{bind.target}:{'rw' if bind.writable else 'ro'}"]
        for key, value in sandbox_env(env).items():
            argv += ["-e", f"{key}={value}"]
        return [*argv, self.image, "bash", "-c", command]

    def run(self, command: str, workspace: Path, limits: Limits | None = None,
            env: dict[str, str] | None = None, binds: Sequence[Bind] = ()) -> ShellResult:
        limits = limits or Limits()
        check_command(command, env)
        real = check_workspace(workspace, ())
        # The image's own /usr etc. are not host paths, so only the sandbox's mounts are taken.
        checked = check_binds(binds, ())
        user = sandbox_ids() if os.geteuid() == 0 else None
        if user is not None:
            give_tree(real, *user)
        container = f"agentworlds-sbx-{uuid.uuid4().hex[:16]}"
        argv = self.build_argv(command, real, limits, container, env, user, checked)

        def kill(proc: subprocess.Popen[bytes]) -> None:
            subprocess.run([self.docker, "kill", container], capture_output=True,
                           check=False, timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

        return shell_result(supervise(argv, limits, kill, env=os.environ), limits)

    def engine_answers(self) -> bool:
        if shutil.which(self.docker) is None:
            return False
        try:
            done = subprocess.run([self.docker, "info"], capture_output=True, check=False,
                                  timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0
