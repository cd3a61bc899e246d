"""Run agent shell commands in a sandbox, never in this process.

``choice.run_sandboxed(command, workspace)`` runs ``bash -c command`` with the instance's
workspace as its writable working directory ``/workspace`` and returns a ``ShellResult``. The
sandbox is bubblewrap where it works (``BubblewrapSandbox``), else Docker where an engine answers
(``DockerSandbox``); ``default_sandbox()`` probes once and caches its choice, unless
``WORLDCTL_SANDBOX=container`` chooses ``ContainerSandbox``.

Every bubblewrap sandbox of the project (this shell, the verifier's runs through it, the
carried-app workers of ``worldenv.sandbox.workers``) is declared as a ``SandboxPolicy`` and turned
into its command line by the one function ``bwrap_argv``, which also holds what no policy
can loosen. ``classify_limit`` names the limit that stopped a process, for the shell and
for the verifier's scripts alike; ``kill_sandbox`` ends a bubblewrap sandbox.

What a command sees under bubblewrap:

* a new root holding only the system directories (``/usr``, ``/etc`` and the ``/bin``,
  ``/lib*``, ``/sbin`` links), read-only; ``/workspace`` (the workspace, read-write;
  a private tmpfs instead with ``Limits.workspace_mib``, as a verifier's);
  fresh ``/proc``, ``/dev`` and size-capped ``/tmp`` and ``/dev/shm``. Everything else of the
  host is absent: the parent of the workspace (so its own ``../services``), every other
  instance, ``/tmp``, ``/root``, ``/home``, ``/work``, ``/var``;
* new pid, network (loopback only), ipc, uts and cgroup namespaces; no capabilities; no
  new privileges; no further user namespaces;
* extra ``binds`` where the caller asks for them (read-only unless marked writable), e.g.
  an interpreter or the worlds a verifier reads;
* an unprivileged uid: as root, the dedicated system user ``agentworlds-sandbox`` (created
  on first use; ``nobody`` if that fails), which is given the workspace tree before every
  run; otherwise the caller's own uid;
* rlimits set by ``prlimit`` before bwrap starts: CPU seconds, address space, file size,
  open files, no core dumps, each per process; and a process limit for the whole sandbox
  (below).

**Roles cannot starve each other.** Four roles run in these sandboxes: the agent shell
(``Limits.max_procs``, 64), the verifier's runs and servers (``gates.verifier``'s limits,
64), the carried-app workers (``WorkerLimits.max_procs``, 64) and the browser
(``worldenv.gui.browser``, 16,384: Chromium's threads, ~27 per open page). Each sandbox gets
its process limit (RLIMIT_NPROC, which counts threads too) set by a ``prlimit`` that runs as
the first process *inside* the sandbox's own user namespace, after bwrap made it. Since
Linux 5.14 the kernel counts RLIMIT_NPROC per (user namespace, uid) and checks each level up
to the host, each against the limit the namespace's creator had: the sandbox's own level
holds its processes alone, so one sandbox that hoards processes or forks a bomb reaches only
its own limit, and every other sandbox (of its role or any other, of its uid or not) still
starts and runs. At the host level the total of one uid's sandboxes is bounded only by that
uid's own RLIMIT_NPROC as the host process had it (the process limit is never set before
bwrap, where it would count every sandbox of the uid together, the host's own processes
included). Per-sandbox accounting rather than a user per role: two instances of the same
role must not starve each other either, a host that does not run as root has one uid to
give, and cgroup pids controllers are writable only where cgroups are delegated (root, or a
systemd user slice); per-sandbox uids would need a reserved range and re-chowning a
workspace whenever its uid changes. The users stay as they were: as root,
``agentworlds-sandbox`` for the shell, the verifier and the app workers, and
``agentworlds-browser`` for the browser; otherwise the caller's uid for all. On a kernel
before 5.14, RLIMIT_NPROC is counted per uid and the limits of sandboxes of one uid are
shared.

As root, a policy with a ``user`` has its mounts made by a privileged bwrap (which can reach
a workspace under directories the sandbox uid cannot traverse, such as ``/root`` or
pytest's 0700 tmp dirs); ``setpriv`` then drops to that uid, clears every capability and
sets no-new-privs, and a second, unprivileged bwrap adds a user namespace with nested user
namespaces disabled. Otherwise one unprivileged bwrap does all of it.

The wall-clock timeout and an output flood (4x ``max_output_bytes`` on one stream) kill the
whole sandbox: its pid 1 first, which tears down the pid namespace, then bwrap's group.
Nothing here uses ``preexec_fn``, so ``run`` is safe to call from threads.

The package, one module per concern:

* ``contract``: the ``Sandbox`` interface, ``Limits``, ``ShellResult``, ``Bind``,
  ``classify_limit``;
* ``policy``: users, system paths, environment, the checks of a command and its binds,
  ``SandboxPolicy``, ``Rlimits``, ``Tmpfs``;
* ``supervise``: the process supervision both backends share;
* ``bubblewrap``: ``bwrap_argv``, ``BubblewrapSandbox``, ``kill_sandbox``,
  ``popen_long_lived``;
* ``docker``: ``DockerSandbox`` (one container per command through the ``docker`` SDK, in
  the local base image of ``deploy/build-base.sh``; what it holds otherwise than
  bubblewrap is in ``docs/peers/docker.md``);
* ``container``: ``ContainerSandbox`` (``WORLDCTL_SANDBOX=container`` only, inside a
  container such as a Harbor task's: the container is the boundary, each command a plain
  process in it under the same user and limits but the process limit, with no network
  isolation);
* ``choice``: ``default_sandbox``, ``run_sandboxed``, ``give_to_sandbox``;
* ``workers`` and ``app_worker``: the carried-app workers (a pool here, the worker process
  in the sandbox).

This module imports nothing: ``python -m worldenv.sandbox.app_worker`` loads it in every app
worker.
"""
