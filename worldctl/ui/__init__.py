"""``worldctl ui``: a read-only web view of the store, for people debugging a world.

Pages (server-rendered from the Jinja2 templates in ``templates/`` with autoescape; no
script, no external resource, one inline style sheet):

* ``/``: the personas, with their days and last event;
* ``/p/<persona>``: its days (events, first and last timestamps, world hash) and a form
  to diff two of them (the day before the latest and the latest, unless changed);
* ``/p/<persona>/<day>``: the day's services and tables (rows per table) and its
  workspace files;
* ``/p/<persona>/<day>/t/<service>/<table>?page=N&q=TEXT``: the table's rows, 50 a page
  in the order the world hash reads them, searchable (rows where any column contains
  TEXT), read through ``replay.browse``;
* ``/p/<persona>/<day>/f/<path>``: a workspace file: text shown escaped, an image shown
  (``/raw/<persona>/<day>/<path>`` serves its bytes);
* ``/diff?a=REF&b=REF``: the row- and file-level diff of two worlds (``worldctl diff``);
  either side may be the path of a world checkout on the server's disk (any side with a
  ``/``: a reference never has one);
* ``/episodes`` and ``/episodes/<id>``: stored episodes, newest first, each with the
  time of its first call and the verdict an eval run recorded for it; and one as a
  timeline of calls with their results and effects (``<id>`` may be any prefix of exactly
  one stored id);
* ``/tasks`` and ``/tasks/<id>``: the tasks given (``--tasks``, as ``worldctl serve``
  reads them; default every shipped and installed pack's), whether each one's start world
  is in the store under the hash it pins, and its latest gate report; one task with all
  its artifacts (instruction, subtasks, hint, rubric, reference solution, the verifier's
  source) and its stored episodes;
* ``/runs`` and ``/runs/<name>``: eval run folders (``--runs``, default ``./runs``), one
  with its configuration, its headline (pass rate with a 95 % interval, n, mean steps,
  cost) and every other metric folded away, and its trials; ``/runs/<name>/report.html`` and
  ``report.md`` serve the report ``worldctl eval report`` wrote (the HTML under the same
  policy, sandboxed).

Gate reports are files: ``worldctl task check --report FILE`` writes one wherever it is
told, so the UI reads the folders ``--reports`` names (and the task records a synthesis
run keeps beside its pack) and shows, per task, the one modified last.

Everything is read from snapshots (pinned while a page reads them) through read-only
connections; workspace files are read with ``replay.files.read_regular`` (no symlink is
followed, nothing but a regular file is opened). Like the gateway, without a token it
answers only requests addressed to a loopback host (and from no or a loopback origin),
and it refuses to listen beyond loopback without one; with a token every request needs
``Authorization: Bearer <token>`` (or ``?token=`` on the first page, kept in a cookie).

The package: ``app`` (routing, the guard, error pages), ``pages`` (one method a page),
``sources`` (tasks, gate reports, eval runs, checkouts, episode ids), ``templating`` (the
Jinja2 environment) and ``command`` (the click command).
"""

from worldctl.ui.app import WorldsUI
from worldctl.ui.command import DEFAULT_PORT, ui_cmd
from worldctl.ui.pages import PAGE_ROWS
from worldctl.ui.sources import GateReports, run_folders, synth_records, task_index

__all__ = ["DEFAULT_PORT", "PAGE_ROWS", "GateReports", "WorldsUI", "run_folders",
           "synth_records", "task_index", "ui_cmd"]
