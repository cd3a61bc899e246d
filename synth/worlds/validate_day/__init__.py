"""Five-layer validation of one persona-day (methods.md section 4).

``validate_day(worlds, "lars@5", produces=..., reviewer=..., env=...)`` runs, in order:

1. **lint** — static checks of the day's stored events: timestamps never go back (within
   the day and against the previous day's last event); workspace paths are clean; SQL that
   reads the clock or randomness (``datetime('now')``, ``CURRENT_TIMESTAMP``, ``random()``)
   is a *warning* (replay freezes both, but the day should write literals); and the
   cross-persona identity check (below), whose collisions fail the layer.
2. **replay** — the day's events applied twice to copies of the previous day's snapshot:
   both runs must give the same world hash, and it must be the recorded one. A difference
   names the first differing table or file and the first event of the day that writes it.
3. **declarations** — every entry of ``produces.json`` (format below) exists in the day's
   world and, for writes, changed against the day before. No produces.json: not run.
4. **health** — an instance of the day opens with ``worldenv.instances.instance.Environment`` (every
   pinned app loads), one read-only tool without required arguments answers without an
   error on every service that has tools, the declared accounts exist in the live
   instance and the declared credentials are found in its workspace. A world that pins no
   apps and declares neither has nothing to check: "not_run", never "passed".
5. **review** — a ``Reviewer`` checks the day's world against the day's plan. Without a
   reviewer the layer is "not_run" ("no model configured"), never "passed".

One module per layer (``lint``, ``replay``, ``declarations``, ``health``, ``review``),
with ``report`` (the result types), ``produces`` (the declarations' format) and
``context`` (the day as every layer reads it); this module runs them in order.

Layers 3-5 need the day's world, so they are "not_run" when replay failed; a failed lint
does not stop anything. The report is ``ok`` when no layer failed, and says how many were
not run.

**Cross-persona identity rule.** A value is *reserved* by another persona Q when it is in
Q's world at Q's last stored day, either (a) in a column named ``name``, ``full_name``,
``display_name``, ``email``, ``handle`` or ``username`` of a table named ``users``,
``contacts``, ``accounts``, ``people`` or ``profiles`` (any service), or (b) under one of
those keys in an object of the workspace file ``accounts.json`` (a JSON list of objects,
or ``{"accounts": [...]}``). The day *inserts* a value when one of its ``sql`` events is an
``INSERT``/``REPLACE`` into such a table that puts the value into such a column (literal or
bound parameter), or when it writes ``accounts.json`` with the value. Values are compared
after collapsing whitespace and case-folding. A collision fails the layer naming the event
(seq and index), the other persona, where that persona holds the value, and the value. An
``INSERT`` into an identity table whose identity values cannot be read statically (no
column list, ``INSERT ... SELECT``, an expression in an identity column) fails too: the
check must not be bypassable. The rule is symmetric: if two stored personas share a
value, each one's inserting day reports the other.

**produces.json** (every field optional, unknown fields refused)::

    {
      "db_writes":   [{"service": "shop", "table": "orders", "where": {"id": 2},
                       "change": "written"}],             # or "removed"; default written
      "files":       ["jobs/nordlys/bom.md", {"path": "docs/old.txt", "change": "removed"}],
      "accounts":    [{"service": "chat", "table": "users", "where": {"id": 1}}],
      "cross_refs":  [{"from": {"service": "chat", "table": "messages", "where": {"id": 50},
                                "column": "body"},
                       "mentions": "AVL-2026-10533",
                       "to": {"service": "shop", "table": "orders", "where": {"id": 2}}}],
      "credentials": [{"file": "accounts.json", "contains": "lars.eriksen"}]
    }

* ``db_writes``: "written" means at least one row matching ``where`` (column = value, all
  of them; ``{}`` matches every row) is in the day's world and no identical row matched
  the day before (the row was added, or changed, or came to match); "removed" means rows
  matched the day before and none matches now.
* ``files``: "written" means the file exists and was created or changed this day;
  "removed" means it existed the day before and does not now.
* ``accounts``: the row exists in the day's world (accounts are used by later days too,
  so they need not change); layer 4 checks them again in the live instance.
* ``cross_refs``: ``from`` (a row, optionally one ``column``, or ``{"file": path}``) was
  written this day and contains the text ``mentions``; ``to``, if given, exists.
* ``credentials`` (layer 4): the workspace file exists and contains the text.

A malformed produces.json fails layer 3, naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from replay.engine import Worlds
from replay.files import remove_tree
from synth.worlds.validate_day.context import DayContext
from synth.worlds.validate_day.declarations import declarations_layer
from synth.worlds.validate_day.health import health_layer, probe_tool
from synth.worlds.validate_day.lint import (
    ACCOUNTS_FILE,
    IDENTITY_COLUMNS,
    IDENTITY_TABLES,
    accounts_file_identities,
    clock_and_random_uses,
    inserted_identities,
    lint_layer,
    path_problem,
    reserved_identities,
)
from synth.worlds.validate_day.produces import CrossRef, Produces, RowRef, RowWrite, load_produces
from synth.worlds.validate_day.replay import replay_layer
from synth.worlds.validate_day.report import LAYERS, DayReport, LayerResult, render_day_report
from synth.worlds.validate_day.review import Reviewer, ReviewOutcome, review_layer
from worldenv.instances.instance import Environment


def validate_day(worlds: Worlds, ref: str, *,
                 produces: Path | Mapping[str, Any] | Produces | None = None,
                 reviewer: Reviewer | None = None, env: Environment | None = None,
                 plan: str | None = None, reserved_by: Worlds | None = None) -> DayReport:
    """Run the five layers on the persona-day `ref` (``persona@day`` or a world hash).
    `reserved_by`: the store whose other personas reserve names (default `worlds`; a
    candidate day checked in a scratch store is held to the real store's personas)."""
    record = worlds.resolve(ref)
    context = DayContext.load(worlds, record)
    layers = [lint_layer(context, reserved_by)]
    scratch = worlds.cache.scratch()
    try:
        replayed, world = replay_layer(context, scratch)
        layers.append(replayed)
        if world is None:
            why = "not run: replay failed, so the day's world is not trustworthy"
            layers += [LayerResult(name, "not_run", why) for name in LAYERS[2:]]
        else:
            declared, parsed = declarations_layer(context, world, produces)
            layers.append(declared)
            layers.append(health_layer(context, parsed, env))
            layers.append(review_layer(world.root, reviewer, plan))
    finally:
        remove_tree(scratch)
    return DayReport(record.persona, record.day, record.world_hash, layers)


__all__ = [
    "ACCOUNTS_FILE",
    "IDENTITY_COLUMNS",
    "IDENTITY_TABLES",
    "LAYERS",
    "CrossRef",
    "DayReport",
    "LayerResult",
    "Produces",
    "ReviewOutcome",
    "Reviewer",
    "RowRef",
    "RowWrite",
    "accounts_file_identities",
    "clock_and_random_uses",
    "inserted_identities",
    "load_produces",
    "path_problem",
    "probe_tool",
    "render_day_report",
    "reserved_identities",
    "validate_day",
]
