"""The one error tree of agent-worlds: every exception class of every package.

Each package keeps its exception classes in its own ``<package>/errors.py``; the whole
tree is drawn here. An entry is: the class, the package whose errors.py defines it, and
what it means (continuation lines, if any, are indented under the meaning).
tests/worldstore/test_errors.py checks the tree against the code in both directions: every public
exception class of the project is drawn here, under its real base class, and everything
drawn here exists where the entry says.

    WorldError                  worldstore  every error the project raises on purpose
    ├── InputError              worldstore  bad interchange input; names file, line and field
    ├── PathError               worldstore  a workspace path that is absolute, has '..', or
    │                                       leaves the workspace
    ├── StoreError              worldstore  the store refuses or fails an operation
    │   ├── ConflictError       worldstore  another writer got there first (a racing append,
    │   │                                   an episode id taken); nothing written
    │   ├── DayOrderError       worldstore  a day that exists already or is not after the last
    │   ├── StoreVersionError   worldstore  a store schema or event schema newer than this code
    │   └── NotFoundError       worldstore  unknown persona, day, world hash, blob or episode
    ├── ConfigError             worldstore  configuration that cannot work, refused at start-up
    ├── FolderError             worldstore  an entry of a handed-over folder that is a link,
    │                                       a special file or a name out of it; nothing written
    ├── ApplyError              replay      an event that failed to apply; names persona, day
    │                                       and event; the whole day is refused
    ├── EventFailed             replay      one event that cannot be applied, before the fold
    │                                       names where (it becomes an ApplyError)
    ├── IntegrityError          replay      stored data that does not match its own hashes
    ├── WorldDirError           replay      a directory that is not a world (bad layout)
    ├── PackError               packs       a pack or pack archive that is refused; names
    │                                       pack, file, field or persona-day
    ├── SandboxError            worldenv    no usable sandbox, or a command or workspace it
    │                                       refuses
    ├── InstanceClosed          worldenv    a call on an instance that was closed
    ├── AppPinError             worldenv    a world pins app code this installation cannot serve
    ├── ResetNeeded             worldenv    step() before reset() or after the episode ended
    ├── AppLoadError            worldenv    carried app code that the worker could not load
    ├── WorkerError             worldenv    an app worker that timed out, died or answered
    │                                       nonsense
    ├── GatewayError            worldenv    a gateway configuration it refuses (an open bind
    │                                       without a token, bad limits)
    ├── BrowserError            worldenv    the instances' browser could not start, stopped,
    │                                       or did not answer in time
    ├── NoModel                 worldllm    no model configured: what needed one did not run
    ├── RecordingMissing        worldllm    replay mode found no recorded answer for a request
    ├── LLMCallError            worldllm    the model provider refused the request or could not
    │                                       be reached
    ├── TaskError               gates       a task folder that does not load; names file and
    │                                       field
    ├── InspectionRefused       gates       a judge's read-only tool refused a call
    ├── InvalidAnswer           gates       a judge's answer that is not the required JSON
    ├── RewardError             gates       input that has no reward (a verifier error, an
    │                                       empty checklist, ...); also a ValueError
    ├── AwmError                awmbridge   an AWM import that is refused (an unknown
    │   │                                   scenario name, no AWM file); nothing stored
    │   ├── AwmFormatError      awmbridge   a file that is not AWM's format; names file and
    │   │                                   line; the whole import is refused
    │   ├── ExportRefused       awmbridge   a synthesized environment that cannot be written
    │   │                                   in AWM's formats; names file and field
    │   └── ScenarioRefused     awmbridge   an AWM scenario that cannot be imported; names
    │                                       file, line and scenario; nothing stored for it
    ├── RLError                 rl          a training dataset, warm start or launch config
    │   │                                   that is refused (an unknown or empty split, a
    │   │                                   task's world not in the store); nothing written
    │   └── RolloutLost         rl          a rollout lost to the infrastructure (instance,
    │                                       verifier, model server); retried on a fresh
    │                                       instance, then reported lost
    ├── EvalError               eval        an evaluation run, report or comparison that is
    │                                       refused (no tasks, a run folder of another
    │                                       configuration, a file that is not results)
    └── SynthError              synth       a synthesis run or input that is refused (a seeds
        │                                   or scenarios file not in the format, an unknown
        │                                   stage, a replay that differs); names what
        └── BudgetSpent         synth       the run's token or cost budget is spent; the run
                                            stops and resumes where it stopped

Outside WorldError on purpose (the root names the foreign base class):

    fastmcp.exceptions.ToolError
    └── ToolError               worldenv    a tool's refusal, raised by app code; the agent sees
                                            it as an error result and it never leaves the tool
                                            call; FastMCP's own, so any FastMCP server passes it on
    builtins.ValueError
    └── ActionError             worldenv    an action object of no protocol shape: a program's
                                            misuse of Gym, REST or OpenEnv (a model's malformed
                                            call is an observation instead)
    builtins.Exception
    ├── HttpError               worldenv    a request a network surface refuses: its status,
    │                                       one-line message, headers and extra fields; never
    │                                       caught as a WorldError (which it answers for)
    └── PageRefused             worldctl    a request the web UI answers with an error page

Classes whose names start with '_' are private control flow inside one module and never
reach a caller; they are not drawn.

Driver errors (sqlite3, psycopg, apsw) are translated in one place per adapter;
nothing outside those adapters catches a driver error.
"""

from __future__ import annotations


class WorldError(Exception):
    """Base of every error agent-worlds raises on purpose."""


class InputError(WorldError):
    """Bad interchange input. The message names the file, the line and the field."""

    def __init__(
        self, message: str, *, file: str | None = None, line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.reason = message
        where = ":".join(str(p) for p in (file, line) if p is not None)
        prefix = f"{where}: " if where else ""
        suffix = f" (field '{field}')" if field else ""
        super().__init__(f"{prefix}{message}{suffix}")


class PathError(WorldError):
    """A workspace path that is absolute, contains '..' or leaves the workspace."""


class StoreError(WorldError):
    """A problem with the event store itself."""


class ConflictError(StoreError):
    """Another writer appended to the same persona first. Nothing was written."""


class DayOrderError(StoreError):
    """A day that already exists, or that is not after the persona's last day."""


class StoreVersionError(StoreError):
    """The store was written by newer code; this code refuses to touch it."""


class NotFoundError(StoreError):
    """An unknown persona, day, world hash or blob."""


class ConfigError(WorldError):
    """Configuration that cannot work (checked at start-up, before anything runs)."""


class FolderError(WorldError):
    """An entry of a folder someone handed over (a run folder, a pack, a checkout) that is
    a link, a special file or a name leading out of it, where the project reads or writes;
    refused before anything is written (``worldstore.folders``)."""
