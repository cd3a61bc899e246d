"""The Docker backend: one throw-away container per command, through the ``docker`` SDK
(the envs extra), used where bubblewrap is unusable and an engine answers.

Its image is the local base that ``deploy/build-base.sh`` makes from Debian's packages
(``agent-worlds-base:latest``, or ``$WORLDCTL_SANDBOX_IMAGE``): no image registry is
needed. The container holds what a bubblewrap sandbox holds, as far as Docker can: no
network, a read-only root, private size-capped ``/tmp`` and ``/dev/shm``, the workspace
(or a tmpfs) at ``/workspace``, the binds, an unprivileged uid with no capability and no
new privileges, the rlimits, a process limit counted for the container alone, and an
init as pid 1 that reaps orphans. Where it differs is said in ``docs/peers/docker.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import selectors
import socket
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from worldenv.errors import SandboxError
from worldenv.sandbox.contract import OUTPUT_KILL_FACTOR, Bind, Limits, Sandbox, ShellResult
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
from worldenv.sandbox.supervise import Outcome, shell_result

__all__ = ["DEFAULT_IMAGE", "LABEL", "DockerSandbox"]

DEFAULT_IMAGE = "agent-worlds-base:latest"
LABEL = "agent-worlds.sandbox"  # on every sandbox container, to find any left behind
_API_TIMEOUT_S = 60
_HEADER = 8  # a frame of Docker's multiplexed stream: stream (1 byte), 0 0 0, size (4 bytes)


class DockerSandbox(Sandbox):
    """One throw-away container per command against a running engine (the docker SDK)."""

    name = "docker"

    def __init__(self, image: str | None = None, *, cpus: float = 1.0,
                 base_url: str | None = None, uid: int | None = None,
                 gid: int | None = None) -> None:
        """`image`: what commands run in (default ``$WORLDCTL_SANDBOX_IMAGE``, else
        ``agent-worlds-base:latest``); `cpus`: the container's CPU share; `base_url`: the
        engine (default: the environment's, as ``docker`` itself finds it); `uid`/`gid`
        (root only): the user commands run as, instead of the sandbox user."""
        self.image = image or os.environ.get("WORLDCTL_SANDBOX_IMAGE") or DEFAULT_IMAGE
        self.cpus = cpus
        self.base_url = base_url
        self._uid = uid
        self._gid = gid
        self._api: Any = None
        self._lock = threading.Lock()

    # --- the engine -----------------------------------------------------------------------

    def api(self) -> Any:
        """The SDK's low-level client (made once); SandboxError if none can be made."""
        with self._lock:
            if self._api is None:
                docker = _sdk()
                try:
                    self._api = (docker.APIClient(base_url=self.base_url,
                                                  timeout=_API_TIMEOUT_S)
                                 if self.base_url else
                                 docker.from_env(timeout=_API_TIMEOUT_S).api)
                except docker.errors.DockerException as exc:
                    raise SandboxError(f"no Docker engine: {exc}") from None
            return self._api

    def ids(self) -> tuple[int, int]:
        """The uid/gid commands run as: the sandbox user's unless overridden (as root)."""
        uid, gid = sandbox_ids()
        if self._uid is not None and os.geteuid() == 0:
            uid = self._uid
            gid = self._gid if self._gid is not None else self._uid
        return uid, gid

    def engine_answers(self) -> bool:
        """Whether an engine answers a ping."""
        try:
            return bool(self.api().ping())
        except Exception:  # the SDK raises its own, requests' and OSError's kinds
            return False

    def image_present(self) -> bool:
        docker = _sdk()
        try:
            self.api().inspect_image(self.image)
        except docker.errors.ImageNotFound:
            return False
        return True

    # --- one run ------------------------------------------------------------------------

    def container_config(self, command: str, workspace: Path, limits: Limits,
                         env: Mapping[str, str] | None = None,
                         user: tuple[int, int] | None = None,
                         binds: Sequence[Bind] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
        """The keyword arguments of the engine's create call for one run: the container's
        and its host config's. `workspace` and the binds' sources are resolved already."""
        types = _sdk().types
        LogConfig, Mount, Ulimit = types.LogConfig, types.Mount, types.Ulimit
        # exec: Docker's tmpfs are noexec unless told, bubblewrap's are not.
        tmpfs = {"/tmp": f"rw,nosuid,nodev,exec,size={limits.tmp_mib}m,mode=1777"}
        mounts = []
        entrypoint = ["/bin/bash", "-c"]
        if limits.workspace_mib is None:
            mounts.append(Mount(MOUNT_AT, str(workspace), type="bind", read_only=False))
        else:
            tmpfs[MOUNT_AT] = f"rw,nosuid,nodev,exec,size={limits.workspace_mib}m,mode=1777"
            # A tmpfs that is also the working directory loses its mode (the runtime makes
            # the directory first), so the shell enters it instead.
            entrypoint = ["/bin/bash", "-c", f'cd {MOUNT_AT} && exec /bin/bash -c "$1"', "bash"]
        mounts += [Mount(b.target, str(b.source), type="bind", read_only=not b.writable)
                   for b in binds]
        user = user or self.ids()
        # RLIMIT_DATA stands for bubblewrap's RLIMIT_AS (which Docker cannot set): since
        # Linux 4.7 it bounds private mappings too, so a hog meets MemoryError the same way.
        # The cgroup's cap is the backstop for the container as a whole, its tmpfs included.
        cgroup_mib = limits.memory_mib + 2 * limits.tmp_mib + (limits.workspace_mib or 0)
        host = {
            "network_mode": "none",
            "read_only": True,
            "tmpfs": tmpfs,
            "shm_size": limits.tmp_mib << 20,
            "mounts": mounts,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "ipc_mode": "private",
            "init": True,
            "pids_limit": limits.max_procs,
            "mem_limit": cgroup_mib << 20,
            "memswap_limit": cgroup_mib << 20,
            "nano_cpus": int(self.cpus * 1e9),
            "ulimits": [Ulimit(name="cpu", soft=limits.cpu_s, hard=limits.cpu_s + 1),
                        Ulimit(name="data", soft=limits.memory_mib << 20,
                               hard=limits.memory_mib << 20),
                        Ulimit(name="fsize", soft=limits.max_file_mib << 20,
                               hard=limits.max_file_mib << 20),
                        Ulimit(name="nofile", soft=MAX_OPEN_FILES, hard=MAX_OPEN_FILES),
                        Ulimit(name="core", soft=0, hard=0)],
            # Output is read from the attached stream only: the engine keeps no log of it,
            # so a flood never reaches the host's disk.
            "log_config": LogConfig(type=LogConfig.types.NONE),
        }
        container = {
            "image": self.image,
            "entrypoint": entrypoint,
            "command": [command],
            "user": f"{user[0]}:{user[1]}",
            "working_dir": MOUNT_AT if limits.workspace_mib is None else "/",
            "environment": sandbox_env(env),
            "hostname": "sandbox",
            "network_disabled": True,
            "labels": {LABEL: "1"},
            "stdin_open": False,
            "tty": False,
        }
        return container, host

    def run(self, command: str, workspace: Path, limits: Limits | None = None,
            env: dict[str, str] | None = None, binds: Sequence[Bind] = ()) -> ShellResult:
        limits = limits or Limits()
        check_command(command, env)
        real = check_workspace(workspace, ())
        # The image's own /usr etc. are not host paths, so only the sandbox's mounts are taken.
        checked = check_binds(binds, ())
        user = self.ids()
        if os.geteuid() == 0:
            give_tree(real, *user)
        container, host = self.container_config(command, real, limits, env, user, checked)
        return self._run(container, host, limits)

    def _run(self, container: dict[str, Any], host: dict[str, Any], limits: Limits
             ) -> ShellResult:
        docker = _sdk()
        api = self.api()
        name = f"agentworlds-sbx-{uuid.uuid4().hex[:16]}"
        try:
            cid = api.create_container(**container, name=name,
                                       host_config=api.create_host_config(**host))["Id"]
        except docker.errors.ImageNotFound:
            raise SandboxError(f"the Docker sandbox's image {self.image} is not here: build "
                               "it with deploy/build-base.sh (no registry is used)") from None
        except docker.errors.DockerException as exc:
            raise SandboxError(f"Docker could not create the sandbox: {exc}") from None
        try:
            out = self._supervise(api, cid, limits)
            state = api.inspect_container(cid)["State"]
        finally:
            with contextlib.suppress(docker.errors.NotFound):
                api.remove_container(cid, force=True)
        result = shell_result(out, limits)
        if result.killed_reason is None and state.get("OOMKilled"):
            result = dataclasses.replace(result, killed_reason="memory")
        return result

    def _supervise(self, api: Any, cid: str, limits: Limits) -> Outcome:
        """Start the container attached, read both streams until it ends, the wall clock
        runs out or one stream floods (then kill it), as ``supervise`` does for a process."""
        import requests

        stream = api.attach_socket(cid, params={"stdout": 1, "stderr": 1, "stream": 1})
        sock: socket.socket = getattr(stream, "_sock", stream)
        try:
            try:
                api.start(cid)
            except _sdk().errors.DockerException as exc:
                raise SandboxError(f"Docker could not start the sandbox: {exc}") from None
            # The wall clock runs from the container's start: the engine's own set-up
            # (~0.5 s) is not the command's time.
            started = time.monotonic()
            deadline = started + limits.timeout_s
            read = _read_frames(sock, deadline, limits.max_output_bytes)
        finally:
            # shutdown, not close alone: the SDK's file object holds the socket open, and an
            # engine writing to an attach nobody reads would stall the container's exit.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            with contextlib.suppress(OSError):
                stream.close()
        status: int | None = None
        timed_out = read.timed_out
        if not (read.timed_out or read.flooded):
            try:  # the output may close long before the command ends
                left = max(0.1, deadline - time.monotonic())
                status = int(api.wait(cid, timeout=left)["StatusCode"])
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                timed_out = True
        if status is None:
            # It may have ended on its own meanwhile: the engine then refuses the kill.
            with contextlib.suppress(_sdk().errors.APIError):
                api.kill(cid)
            api.wait(cid, timeout=_API_TIMEOUT_S)
        seconds = time.monotonic() - started
        keep = limits.max_output_bytes
        # No process's rusage comes back from a container; its CPU time is at most its wall
        # time at its CPU share, which is enough to tell a SIGKILL of the hard CPU limit
        # (cpu_s + 1 seconds of CPU) from any other.
        return Outcome(status=status, stdout=bytes(read.kept[0]), stderr=bytes(read.kept[1]),
                        stdout_cut=read.seen[0] > keep, stderr_cut=read.seen[1] > keep,
                        timed_out=timed_out, flooded=read.flooded,
                        cpu_s=seconds * self.cpus, seconds=seconds)


def _sdk() -> Any:
    """The docker SDK, imported on first use: it comes with the ``envs`` extra, and a
    checkout without it still runs everything but this backend."""
    try:
        import docker
        import docker.errors
        import docker.types
    except ImportError as exc:
        raise SandboxError("the Docker sandbox needs the docker SDK: "
                           "pip install 'agent-worlds[envs]'") from exc
    return docker


@dataclasses.dataclass
class _Read:
    kept: tuple[bytearray, bytearray] = (bytearray(), bytearray())
    seen: list[int] = dataclasses.field(default_factory=lambda: [0, 0])
    timed_out: bool = False
    flooded: bool = False


def _read_frames(sock: socket.socket, deadline: float, keep: int) -> _Read:
    """Demultiplex the attached stream (stdout and stderr frames) until it ends, the
    deadline passes or one stream passes ``OUTPUT_KILL_FACTOR`` times `keep`."""
    got = _Read(kept=(bytearray(), bytearray()))
    hard_cap = OUTPUT_KILL_FACTOR * keep
    buffer = bytearray()
    sock.setblocking(False)
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                got.timed_out = True
                return got
            if not sel.select(left):
                continue
            try:
                chunk = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            if not chunk:
                return got
            buffer += chunk
            while len(buffer) >= _HEADER:
                size = int.from_bytes(buffer[4:8], "big")
                if len(buffer) < _HEADER + size:
                    break
                which = 1 if buffer[0] == 2 else 0
                data = bytes(buffer[_HEADER:_HEADER + size])
                del buffer[:_HEADER + size]
                got.seen[which] += len(data)
                room = keep - len(got.kept[which])
                if room > 0:
                    got.kept[which].extend(data[:room])
                if got.seen[which] > hard_cap:
                    got.flooded = True
                    return got
