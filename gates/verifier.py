"""The verifier runtime: V(W0, W, a) from a folder of scripts, run in the sandbox.

``run_verifier(verifier_dir, w0, w, answer)`` runs every ``*.py`` file directly in
`verifier_dir` (sorted by name; names starting with ``_`` are helpers, not scripts) in one
sandbox (``worldenv.sandbox``: no network, bounded time, CPU, memory, processes and output)
holding one Python start, the project's own Python in isolated mode (``-I -S -B``: standard
library only, no bytecode written): the driver (``awdriver.drive``, beside the SDK in
``gates/sdk/``) imports the SDK and the common standard modules once, then forks a
process per script, which runs it as ``__main__`` with its own stdout and stderr, its own
time and output limits, and the sandbox's per-process CPU, memory and file-size limits. A
script reads the worlds and prints its checklist as a last ``RESULT_JSON=`` line; the
driver reports each script's status and output on its own stdout, and the runner collects
them into a ``Verdict`` (gates.contract). What a script sees is listed in the SDK's
docstring: ``/w0``, ``/w``, ``/answer.txt``, ``/verifier`` and ``/sdk``, all read-only
(``/verifier`` writable on request, for the counterfactual probe), and a scratch
``/workspace``, a tmpfs of ``tmp_mib`` (``Limits.workspace_mib``) like /tmp and /dev/shm,
so what a verifier writes is bounded and never reaches the host's disk. The verifier
folder comes last on a script's module path, after the standard library and the SDK.
Why a script cannot write another script's report is said where the driver is
(``gates/sdk/awdriver.py``).

Two kinds of failure are kept apart (one error boundary per layer):

* a bad script (no or malformed ``RESULT_JSON`` line, non-boolean checks, a crash, a
  timeout, a limit, an output flood) is data: its ``ScriptResult.error`` says which script
  and why, and the verdict is an error verdict, never a pass. The others are judged as if
  it were not there. A script that kills the driver leaves the scripts not yet reported
  unjudged, which is an error too. The runner never raises for a script;
* an unusable sandbox, a world that is not a world directory, or a world the sandbox user
  cannot read raises (``SandboxError``, ``WorldDirError``, ``TaskError``): that is the
  caller's problem, not the task's.

Scripts never run in this process, and the driver writes a start marker to its stderr
before the first script starts, so a sandbox that failed to start is told apart from a
script that failed however it likes.

With ``scratch`` (a directory on the worlds' file system) a run goes to a verifier
server instead (``gates.verifier_server``): the same driver in a sandbox kept from run to
run, the run staged where it sees it, and its outcome judged by the same code below, so
the verdict is the one a sandbox of its own gives; runs a server cannot give that verdict
for still get a sandbox of their own.

``run_awm_verify(code, initial_db, final_db)`` runs AWM-style verification code
(``verify_task(initial_db_path, final_db_path) -> dict``) in the same sandbox: the dict's
booleans become checks, its other values evidence. ``verifier_digests(verifier_dir)``
fingerprints every file of a verifier folder for the counterfactual-probe gate.
"""

from __future__ import annotations

import atexit
import binascii
import dataclasses
import hashlib
import importlib.util
import json
import os
import py_compile
import shlex
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from gates.contract import Check, ScriptResult, Verdict
from gates.errors import TaskError
from gates.verifier_server import ServerSetup, run_served
from replay.files import chmod_tree
from replay.layout import check_world_dir
from worldenv.errors import SandboxError
from worldenv.sandbox.choice import default_sandbox
from worldenv.sandbox.contract import (
    OUTPUT_KILL_FACTOR,
    Bind,
    Limits,
    Sandbox,
    ShellResult,
    classify_limit,
)

__all__ = [
    "RESULT_PREFIX",
    "SDK_DIR",
    "VERIFIER_LIMITS",
    "AwmResult",
    "DriverReport",
    "ScriptRun",
    "driver_argv",
    "read_driver_output",
    "run_awm_verify",
    "run_verifier",
    "script_names",
    "sdk_folder",
    "verifier_digests",
]

SDK_DIR = Path(__file__).resolve().parent / "sdk"
RESULT_PREFIX = "RESULT_JSON="
PYTHON_AT, SDK_AT, VERIFIER_AT = "/opt/python", "/sdk", "/verifier"
W0_AT, W_AT, ANSWER_AT = "/w0", "/w", "/answer.txt"
AWM_AT = "/awm"
AWM_SCRIPT = "verify_task"  # the script name of an AWM result's checks
MAX_PARALLEL = 4
TAIL_CHARS = 2000
# Written by the driver to its own stderr before the first script starts.
STARTED = "agentworlds-verifier: started"
TRUNCATED = "\n[... output truncated at {} bytes ...]"  # as worldenv.sandbox marks a cut stream
RECORD_BYTES = 1024  # a driver record without its two output fields, at most

# A verifier reads two small worlds: seconds, not minutes. Processes stay at the sandbox's
# default because RLIMIT_NPROC counts every process of the sandbox uid, concurrent
# sandboxes included.
VERIFIER_LIMITS = Limits(timeout_s=10.0, cpu_s=10, memory_mib=512, max_procs=64,
                         max_output_bytes=64 * 1024, max_file_mib=16, tmp_mib=32)

# Runs as `python -I -S -B -c DRIVER CONFIG`: -I drops PYTHONPATH and the working
# directory from sys.path (-P), so the path is the standard library's, and the SDK goes
# in after it. The verifier folder is never on the driver's path: each script's process
# puts it last (``awdriver._run_child``), so no file of a verifier folder is ever imported in
# place of a module of the standard library or the SDK, by the driver or by a script.
DRIVER = (
    "import json, sys\n"
    "config = json.loads(sys.argv[1])\n"
    "sys.path.append(config['sdk'])\n"
    "import awdriver\n"
    "awdriver.drive(config)\n"
)

# The AWM driver: load the code as a module (its `if __name__ == "__main__"` stays idle),
# call verify_task on the two databases, print the dict as checks and evidence.
AWM_DRIVER = (
    "import json, runpy, sys\n"
    f"sys.stderr.write({STARTED!r} + '\\n')\n"
    "sys.stderr.flush()\n"
    f"sys.path.append({SDK_AT!r})\n"
    f"module = runpy.run_path('{AWM_AT}/verify.py', run_name='awm_verify')\n"
    "verify = module.get('verify_task')\n"
    "if not callable(verify):\n"
    "    sys.exit('the code defines no function verify_task(initial_db_path, final_db_path)')\n"
    f"out = verify('{AWM_AT}/initial.sqlite', '{AWM_AT}/final.sqlite')\n"
    "if not isinstance(out, dict):\n"
    "    sys.exit(f'verify_task returned {type(out).__name__}, not a dict')\n"
    "checks = {str(k): v for k, v in out.items() if isinstance(v, bool)}\n"
    "evidence = {str(k): v for k, v in out.items() if not isinstance(v, bool)}\n"
    f"print({RESULT_PREFIX!r} + json.dumps({{'checks': checks, 'evidence': evidence}}, "
    "default=repr))\n"
)


class AwmResult(msgspec.Struct, frozen=True):
    """What one AWM ``verify_task`` call returned: its booleans as checks (in the dict's
    order), everything else as evidence; ``error`` when it produced no usable dict."""

    checks: list[Check]
    evidence: dict[str, Any]
    error: str | None
    exit_code: int | None
    seconds: float
    stdout_tail: str = ""
    stderr_tail: str = ""

    @property
    def passed(self) -> bool:
        """Like ``Verdict.passed``: no error, at least one check, every check true."""
        return self.error is None and bool(self.checks) and all(c.passed for c in self.checks)

    def as_verdict(self) -> Verdict:
        script = ScriptResult(AWM_SCRIPT, self.checks, self.error, self.exit_code,
                              self.seconds, self.stdout_tail, self.stderr_tail)
        return Verdict(checks=list(self.checks), scripts=[script],
                       errors=[self.error] if self.error else [])


@dataclasses.dataclass(frozen=True)
class ScriptRun:
    """How one script's process ended: what the driver reported for it (or, for AWM code,
    what its sandbox did). Streams are decoded as UTF-8 (bad bytes replaced); a stream cut
    at ``max_output_bytes`` ends with the sandbox's truncation mark."""

    exit_code: int | None  # 128 + N when killed by signal N; None when killed for a limit
    stdout: str
    stderr: str
    stdout_cut: bool
    timed_out: bool
    killed_reason: str | None  # classify_limit: "timeout", "cpu", "memory", ...
    seconds: float
    start_error: str | None = None  # the driver could not start it at all


class DriverReport(NamedTuple):
    """What a driver's stdout says: each reported script's run, and what in it is not a
    record the driver writes (then nothing in it is trusted)."""

    runs: dict[str, ScriptRun]
    damage: list[str]


# --- the public entry points ------------------------------------------------------------


def script_names(verifier_dir: Path) -> list[str]:
    """The scripts of a verifier folder, in the order they are reported."""
    if not verifier_dir.is_dir():
        raise TaskError("the verifier folder does not exist", file=str(verifier_dir))
    return sorted(entry.name for entry in verifier_dir.iterdir()
                  if entry.name.endswith(".py") and not entry.name.startswith("_")
                  and entry.is_file())


def run_verifier(verifier_dir: Path, w0: Path, w: Path, answer: str | None, *,
                 limits: Limits | None = None, sandbox: Sandbox | None = None,
                 writable_verifier: bool = False, parallel: int = MAX_PARALLEL,
                 scratch: Path | None = None) -> Verdict:
    """V(W0, W, a): run every script of `verifier_dir` in the sandbox and collect the
    checklist. Up to `parallel` scripts run at once; the result is in name order.

    `w0` and `w` are world directories (``services/``, ``workspace/``, ``apps/``), e.g. a
    cached snapshot and an instance's mount after ``Instance.hash()``; `answer` None reaches
    the scripts as "". `writable_verifier` binds the folder read-write (the counterfactual
    probe then compares ``verifier_digests`` before and after); the sandbox uid can still
    write only what the files' permissions let others write. `scratch`: a directory on
    the worlds' file system (a snapshot cache's ``tmp``) where a verifier server may stage
    the run (``gates.verifier_server``: the same verdict without a sandbox start per run);
    None runs it in a sandbox of its own.
    """
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, not {parallel}")
    names = script_names(verifier_dir)
    if not names:
        return Verdict(checks=[], scripts=[], errors=[
            f"{verifier_dir}: no verifier scripts (*.py files not starting with '_')"])
    for world in (w0, w):
        check_world_dir(world)
    for path in (verifier_dir, w0, w, sdk_folder()):
        _require_readable(path)
    box = sandbox or default_sandbox()
    lim = _scratch_in_memory(limits or VERIFIER_LIMITS)
    whole = _run_limits(lim, len(names), parallel)
    served = None
    if scratch is not None and not writable_verifier:
        served = run_served(box, lim, scratch, _server_setup(), verifier_dir, w0, w, answer,
                            _driver_config(names, lim, parallel), whole)
    shell = served if served is not None else _run_alone(
        box, verifier_dir, w0, w, answer, names, lim, whole, parallel, writable_verifier)
    results = _results(names, shell, lim, whole)
    checks = [check for result in results for check in result.checks]
    errors = [result.error for result in results if result.error is not None]
    return Verdict(checks=checks, scripts=results, errors=errors)


def _run_alone(box: Sandbox, verifier_dir: Path, w0: Path, w: Path, answer: str | None,
               names: list[str], lim: Limits, whole: Limits, parallel: int,
               writable_verifier: bool) -> ShellResult:
    """One run in a sandbox of its own, the worlds and the verifier bound in."""
    with tempfile.TemporaryDirectory(prefix="agentworlds-verifier-") as staging:
        answer_file = Path(staging) / "answer.txt"
        answer_file.write_text(answer or "", encoding="utf-8")
        answer_file.chmod(0o444)  # the staging dir is private; the file itself is bound
        binds = [*_python_binds(),
                 Bind(w0, W0_AT), Bind(w, W_AT), Bind(answer_file, ANSWER_AT),
                 Bind(verifier_dir, VERIFIER_AT, writable=writable_verifier)]
        env = {**_python_env(), "AW_W0": W0_AT, "AW_W": W_AT, "AW_ANSWER": ANSWER_AT}
        argv = driver_argv(_sandbox_python(), names, lim, parallel)
        return _run_in_scratch(box, shlex.join(["exec", *argv]), whole, env, binds)


def _server_setup() -> ServerSetup:
    config = {"serve": True, "sdk": SDK_AT, "verifier": VERIFIER_AT, "marker": STARTED}
    return ServerSetup(
        argv=[_sandbox_python(), "-I", "-S", "-B", "-c", DRIVER, json.dumps(config)],
        env={**_python_env(), "AW_W0": W0_AT, "AW_W": W_AT, "AW_ANSWER": ANSWER_AT},
        binds=_python_binds(),
        targets={"w0": W0_AT, "w": W_AT, "verifier": VERIFIER_AT, "answer": ANSWER_AT},
        marker=STARTED)


def _driver_config(names: Sequence[str], limits: Limits, parallel: int) -> dict[str, object]:
    """What the driver needs to run one set of scripts, in a one-run sandbox or a server."""
    return {"scripts": list(names), "timeout_s": limits.timeout_s,
            "cap": limits.max_output_bytes,
            "kill_at": OUTPUT_KILL_FACTOR * limits.max_output_bytes, "parallel": parallel}


def driver_argv(python: str, names: Sequence[str], limits: Limits, parallel: int, *,
                sdk_dir: str = SDK_AT, verifier_dir: str = VERIFIER_AT) -> list[str]:
    """The command line of one run's driver: `python` in isolated mode running the scripts
    `names` of `verifier_dir` with the SDK in `sdk_dir`, at most `parallel` at once, each
    within ``limits.timeout_s`` and ``limits.max_output_bytes`` per stream. What it prints
    is read by ``read_driver_output``; outside a sandbox (benchmarks) it runs as well."""
    config = {**_driver_config(names, limits, parallel), "sdk": sdk_dir,
              "verifier": verifier_dir, "marker": STARTED}
    return [python, "-I", "-S", "-B", "-c", DRIVER, json.dumps(config)]


def read_driver_output(names: Sequence[str], stdout: str, limits: Limits) -> DriverReport:
    """The runs in a driver's stdout: one JSON record per line, each naming one of `names`
    once. A last line without its newline is a record cut off by a kill and is dropped."""
    runs: dict[str, ScriptRun] = {}
    damage: list[str] = []
    for number, line in enumerate(stdout.split("\n")[:-1], 1):
        try:
            record = json.loads(line)
            name = record["script"]
            if name not in names or name in runs:
                raise ValueError(f"a second or unknown record for {name!r}")
            runs[name] = _script_run(record, limits)
        except (ValueError, KeyError, TypeError) as exc:  # binascii.Error is a ValueError
            damage.append(f"line {number}: {exc}")
    return DriverReport(runs, damage)


def run_awm_verify(code: str | Path, initial_db: Path, final_db: Path, *,
                   limits: Limits | None = None, sandbox: Sandbox | None = None) -> AwmResult:
    """Run AWM verification code (source text, or a file holding it) on two databases."""
    source = code.read_text(encoding="utf-8") if isinstance(code, Path) else code
    for db in (initial_db, final_db):
        if not db.is_file():
            raise SandboxError(f"{db}: no such database file")
        _require_readable(db)
    box = sandbox or default_sandbox()
    lim = _scratch_in_memory(limits or VERIFIER_LIMITS)
    with tempfile.TemporaryDirectory(prefix="agentworlds-awm-") as staging:
        script = Path(staging) / "verify.py"
        script.write_text(source, encoding="utf-8")
        script.chmod(0o444)
        binds = [*_python_binds(), Bind(script, f"{AWM_AT}/verify.py"),
                 Bind(initial_db, f"{AWM_AT}/initial.sqlite"),
                 Bind(final_db, f"{AWM_AT}/final.sqlite")]
        shell = _run_in_scratch(box, _python_command(AWM_DRIVER), lim, _python_env(), binds)
    stderr = _strip_marker(AWM_SCRIPT, shell)
    tails = _tail(shell.stdout), _tail(stderr)
    error = _failure(_sandbox_run(shell, stderr, lim), lim)
    checks: list[Check] = []
    evidence: dict[str, Any] = {}
    if error is None:
        try:
            doc = _verdict_object(shell.stdout)
            checks = _checks(AWM_SCRIPT, doc.get("checks"), allow_empty=True)
            found = doc.get("evidence")
            evidence = found if isinstance(found, dict) else {}
        except _BadOutput as exc:
            error = str(exc)
    if error is not None:
        error = f"AWM {AWM_SCRIPT}: {error}"
        checks, evidence = [], {}
    return AwmResult(checks, evidence, error, shell.exit_code, shell.seconds, *tails)


def verifier_digests(verifier_dir: Path) -> dict[str, str]:
    """SHA-256 of every file under `verifier_dir`, by sorted relative path. A symlink is
    digested by its target text (never followed), so re-pointing one counts as an edit."""
    if not verifier_dir.is_dir():
        raise TaskError("the verifier folder does not exist", file=str(verifier_dir))
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(verifier_dir):
        dirnames.sort()
        here = Path(dirpath)
        links = [d for d in dirnames if (here / d).is_symlink()]
        for name in filenames + links:
            path = here / name
            found[path.relative_to(verifier_dir).as_posix()] = _file_digest(path)
    return dict(sorted(found.items()))


# --- running ------------------------------------------------------------------------------


def _file_digest(path: Path) -> str:
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        return hashlib.sha256(b"symlink:" + os.fsencode(os.readlink(path))).hexdigest()
    if not stat.S_ISREG(mode):  # a fifo or socket: never open it, only note its kind
        return hashlib.sha256(f"special:{stat.S_IFMT(mode):o}".encode()).hexdigest()
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _python_binds() -> list[Bind]:
    return [Bind(Path(os.path.realpath(sys.base_prefix)), PYTHON_AT),
            Bind(sdk_folder(), SDK_AT)]


_sdk_lock = threading.Lock()
_sdk_copies: dict[tuple[tuple[str, int, int], ...], Path] = {}


def sdk_folder() -> Path:
    """The SDK folder a run binds at ``/sdk``: a copy of it with its bytecode beside it,
    made once per process (and again if a source file changes). The sandbox's Python
    writes no bytecode (-B), so from the bare source it would compile the SDK on every run
    (~10 ms, a tenth of a run); the bytecode carries its source's hash, so it is never
    used for other source. Where no copy can be made, the folder itself."""
    sources = sorted(SDK_DIR.glob("*.py"))
    key = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sources)
    with _sdk_lock:
        if key not in _sdk_copies or not _sdk_copies[key].is_dir():
            try:
                _sdk_copies[key] = _copy_and_compile(sources)
            except (OSError, py_compile.PyCompileError):
                return SDK_DIR
        return _sdk_copies[key]


def _copy_and_compile(sources: list[Path]) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="agentworlds-sdk-"))
    atexit.register(_remove_if_ours, folder, os.getpid())
    for source in sources:
        copy = folder / source.name
        shutil.copyfile(source, copy)
        cached = importlib.util.cache_from_source(str(copy))
        py_compile.compile(str(copy), cfile=cached, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    chmod_tree(folder, dirs=0o755, files=0o644)  # the sandbox user reads it as "other"
    return folder


def _python_env() -> dict[str, str]:
    # -I ignores PYTHONPATH; it is set for scripts that start a non-isolated Python. The
    # interpreter's RUNPATH names its host prefix, absent in the sandbox: hence the loader path.
    return {"LD_LIBRARY_PATH": f"{PYTHON_AT}/lib", "PYTHONPATH": SDK_AT,
            "PYTHONDONTWRITEBYTECODE": "1"}


def _sandbox_python() -> str:
    return f"{PYTHON_AT}/bin/python{sys.version_info[0]}.{sys.version_info[1]}"


def _python_command(code: str, *args: str) -> str:
    return shlex.join(["exec", _sandbox_python(), "-I", "-S", "-B", "-c", code, *args])


def _scratch_in_memory(limits: Limits) -> Limits:
    """`limits` with ``/workspace`` a tmpfs (``tmp_mib`` unless sized already): what a
    verifier writes is bounded and never reaches the host's disk."""
    return dataclasses.replace(limits, workspace_mib=limits.workspace_mib or limits.tmp_mib)


def _run_limits(per_script: Limits, n: int, parallel: int) -> Limits:
    """The sandbox's limits for a run of `n` scripts. CPU, memory, file size and processes
    stay as they are (per process, or per uid). The wall clock allows every round of
    `parallel` scripts its timeout twice (a script may wait for processes to spare before
    it starts) plus one for the driver; the output allows every script's report."""
    rounds = -(-n // min(parallel, n))
    b64 = 4 * -(-per_script.max_output_bytes // 3)
    report = n * (2 * b64 + RECORD_BYTES)
    return dataclasses.replace(per_script, timeout_s=per_script.timeout_s * (2 * rounds + 1),
                               max_output_bytes=max(per_script.max_output_bytes, report))


def _remove_if_ours(folder: Path, owner: int) -> None:
    """At exit; a forked child inherits the hook, but the folder is its parent's."""
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def _run_in_scratch(box: Sandbox, command: str, limits: Limits, env: dict[str, str],
                    binds: Sequence[Bind]) -> ShellResult:
    """One sandbox run with a fresh private scratch workspace, removed afterwards."""
    scratch = tempfile.mkdtemp(prefix="agentworlds-verify-")
    try:
        return box.run(command, Path(scratch), limits, env, binds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _require_readable(top: Path) -> None:
    """As root, scripts run as an unprivileged uid that reads only what others may read;
    a world closed to it would make every script fail, so refuse it up front."""
    if os.geteuid() != 0:
        return
    if not top.exists():
        raise SandboxError(f"{top}: does not exist")
    for path in [top, *_tree(top)]:
        mode = os.lstat(path).st_mode
        need = stat.S_IROTH | stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
        if not stat.S_ISLNK(mode) and mode & need != need:
            raise SandboxError(
                f"{path}: mode {stat.S_IMODE(mode):o} is closed to the sandbox user, which "
                "reads only what others may read (make it o+r, directories o+rx)")


def _tree(top: Path) -> list[Path]:
    if not top.is_dir():
        return []
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        found += [Path(dirpath, name) for name in sorted(dirnames + filenames)]
    return found


# --- judging one run ----------------------------------------------------------------------


class _BadOutput(Exception):
    """A script's stdout holds no usable verdict."""


def _results(names: list[str], shell: ShellResult, limits: Limits,
             whole: Limits) -> list[ScriptResult]:
    """Each script's result from its run's sandbox: judged from its record, or an error
    saying why it has none. A damaged report trusts no record in it."""
    driver_stderr = _strip_marker(", ".join(names), shell)
    report = read_driver_output(names, shell.stdout, limits)
    return [_script_result(name, report.runs[name], limits)
            if name in report.runs and not report.damage
            else _unjudged(name, shell, whole, report.damage, driver_stderr)
            for name in names]


def _script_run(record: dict[str, Any], limits: Limits) -> ScriptRun:
    """A driver record as a run; raises KeyError, TypeError or ValueError for anything
    that is not a record the driver writes."""
    if record.get("start_error") is not None:
        return ScriptRun(None, "", "", False, False, None, 0.0,
                         start_error=str(record["start_error"]))
    stdout = _decoded(record["stdout"], bool(record["stdout_cut"]), limits)
    stderr = _decoded(record["stderr"], bool(record["stderr_cut"]), limits)
    code, cpu_s = record["exit"], float(record["cpu_s"])
    if code is not None and not isinstance(code, int):
        raise TypeError(f"exit status {code!r}")
    # The driver supervises each script as the sandbox supervises the driver, so one
    # classifier reads both.
    reason = classify_limit(code, stderr, limits, cpu_s=cpu_s,
                            timed_out=bool(record["timed_out"]), flooded=bool(record["flooded"]))
    return ScriptRun(code, stdout, stderr, bool(record["stdout_cut"]),
                     bool(record["timed_out"]), reason, float(record["seconds"]))


def _decoded(b64: str, cut: bool, limits: Limits) -> str:
    text = binascii.a2b_base64(b64, strict_mode=True).decode("utf-8", errors="replace")
    return text + TRUNCATED.format(limits.max_output_bytes) if cut else text


def _sandbox_run(shell: ShellResult, stderr: str, limits: Limits) -> ScriptRun:
    """One sandbox's run (the AWM driver's) as a script run."""
    cut = shell.stdout.endswith(TRUNCATED.format(limits.max_output_bytes))
    return ScriptRun(shell.exit_code, shell.stdout, stderr, cut, shell.timed_out,
                     shell.killed_reason, shell.seconds)


def _script_result(name: str, run: ScriptRun, limits: Limits) -> ScriptResult:
    error = _failure(run, limits)
    checks: list[Check] = []
    evidence: dict[str, Any] = {}
    if error is None:
        try:
            doc = _verdict_object(run.stdout)
            evidence = _evidence(doc.get("evidence", {}))
            # An evidence-only script (an AWM sql-mode verifier) checks nothing itself:
            # the code-augmented judge classifies its evidence.
            checks = _checks(name, doc.get("checks"), allow_empty=bool(evidence))
        except _BadOutput as exc:
            error, evidence = str(exc), {}
    return ScriptResult(
        script=name, checks=checks,
        error=None if error is None else f"verifier script {name}: {error}",
        exit_code=run.exit_code, seconds=run.seconds,
        stdout_tail=_tail(run.stdout), stderr_tail=_tail(run.stderr), evidence=evidence)


def _evidence(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _BadOutput(f'"evidence" must be an object, not {_preview(raw)}')
    return raw


def _unjudged(name: str, shell: ShellResult, whole: Limits, damage: list[str],
              driver_stderr: str) -> ScriptResult:
    """A script the driver did not report (or whose report cannot be trusted)."""
    if damage:
        why = f"not judged: the driver's report is damaged ({damage[0]})"
    elif shell.timed_out:
        why = (f"timed out: the run as a whole was stopped after {whole.timeout_s:g} s "
               "(its limit timeout_s) before this script was reported; killed")
    else:
        why = (f"not judged: the driver ended (exit status {shell.exit_code}) before "
               "reporting this script")
        last = _last_line(driver_stderr)
        why = f"{why}: {last}" if last else why
    return ScriptResult(script=name, checks=[], error=f"verifier script {name}: {why}",
                        exit_code=None, seconds=shell.seconds,
                        stderr_tail=_tail(driver_stderr))


def _strip_marker(name: str, shell: ShellResult) -> str:
    """stderr without the start marker. No marker and no timeout: the sandbox or Python
    failed before `name` started, which no script can cause."""
    # The first occurrence is the driver's own: scripts run only after it. Whatever
    # precedes it came from the sandbox's set-up and is kept.
    at = shell.stderr.find(STARTED + "\n")
    if at >= 0:
        return shell.stderr[:at] + shell.stderr[at + len(STARTED) + 1:]
    if not shell.timed_out:
        raise SandboxError(f"the sandbox failed before {name} started (exit "
                           f"{shell.exit_code}): {shell.stderr.strip()[-TAIL_CHARS:]}")
    return shell.stderr


def _failure(run: ScriptRun, limits: Limits) -> str | None:
    """Why a finished run cannot give a verdict, judged from how it ended."""
    if run.start_error is not None:
        return f"could not be started: {run.start_error}"
    if run.timed_out:
        return f"timed out after {limits.timeout_s:g} s (limit timeout_s); killed"
    if run.killed_reason == "output limit":
        return (f"flooded its output (over {OUTPUT_KILL_FACTOR * limits.max_output_bytes} "
                "bytes on one stream); killed")
    if run.exit_code != 0:
        why = f"exited with status {run.exit_code}"
        if run.killed_reason is not None:
            why += f" (stopped by the {run.killed_reason} limit)"
        last = _last_line(run.stderr)
        return f"{why}: {last}" if last else why
    if run.stdout_cut:
        return (f"printed over {limits.max_output_bytes} bytes on stdout, so its last "
                "RESULT_JSON line cannot be known")
    return None


def _verdict_object(stdout: str) -> dict[str, Any]:
    """The JSON object of the last ``RESULT_JSON=`` line of stdout."""
    for line in reversed(stdout.split("\n")):
        if line.startswith(RESULT_PREFIX):
            text = line[len(RESULT_PREFIX):].rstrip("\r")
            break
    else:
        raise _BadOutput(f"printed no {RESULT_PREFIX} line on stdout")
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as exc:
        raise _BadOutput(f"its {RESULT_PREFIX} line is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or "checks" not in doc:
        raise _BadOutput(f'its {RESULT_PREFIX} value must be an object with "checks", '
                         f"not {_preview(doc)}")
    return doc


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, val in pairs:
        if key in seen:
            raise ValueError(f"key {key!r} appears twice")
        seen[key] = val
    return seen


def _checks(script: str, raw: Any, *, allow_empty: bool = False) -> list[Check]:
    """The checks of a ``"checks"`` value: {name: bool} or [{"name", "passed"}]."""
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, list):
        pairs = [_list_entry(i, entry) for i, entry in enumerate(raw)]
    else:
        raise _BadOutput(f'"checks" must be an object or a list, not {_preview(raw)}')
    if not pairs and not allow_empty:
        raise _BadOutput('"checks" is empty: a verifier script must check something')
    checks: list[Check] = []
    seen: set[str] = set()
    for name, passed in pairs:
        if not name:
            raise _BadOutput('a check has an empty name')
        if name in seen:
            raise _BadOutput(f"check {name!r} appears twice")
        if not isinstance(passed, bool):
            raise _BadOutput(f"check {name!r} is {_preview(passed)}, not true or false")
        seen.add(name)
        checks.append(Check(script=script, name=name, passed=passed))
    return checks


def _list_entry(index: int, entry: Any) -> tuple[str, Any]:
    if not isinstance(entry, dict) or set(entry) != {"name", "passed"} \
            or not isinstance(entry["name"], str):
        raise _BadOutput(f'"checks"[{index}] must be {{"name": string, "passed": bool}}, '
                         f"not {_preview(entry)}")
    return entry["name"], entry["passed"]


def _preview(value: Any) -> str:
    text = json.dumps(value, default=repr)
    short = text if len(text) <= 80 else text[:77] + "..."
    return f"{short} ({type(value).__name__})"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:500] if lines else ""


def _tail(text: str) -> str:
    return text[-TAIL_CHARS:]
