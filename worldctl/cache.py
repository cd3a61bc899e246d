"""The snapshot cache's commands: ``cache stats`` and ``cache prune``.

Each makes one call of ``replay.engine.Worlds`` (``cache_stats``, ``cache_prune``) and
renders the result. The cap they report is this invocation's: env ``WORLDCTL_CACHE_MAX``
or the default (see ``replay.cache``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from replay.cache import CachedEntry, CacheStats, PruneReport, format_size, parse_size
from worldctl import render
from worldctl.session import worlds

NO_DAY = "(no stored day)"  # a cached world that no stored persona-day has


class SizeType(click.ParamType[int]):
    """A size such as 10G, 512M or 0 (K, M, G, T are powers of 1024)."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        return parse_size(str(value), what=f"--{param.name.replace('_', '-')}" if param
                          and param.name else "size")


@click.group()
def cache() -> None:
    """The snapshot cache: what it holds, and pruning it."""


@cache.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Entries, total bytes, cap, pinned entries, oldest and newest use, per persona."""
    found, days = worlds(ctx).cache_stats()
    if as_json:
        render.emit_json(stats_dict(found, days))
    else:
        render.echo(stats_text(found, days))


@cache.command()
@click.option("--max-size", type=SizeType(), default=None,
              help="Evict until the cache holds at most SIZE (default: the cap).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def prune(ctx: click.Context, max_size: int | None, as_json: bool) -> None:
    """Evict least recently used snapshots until the cache is under SIZE.

    Snapshots an open instance uses (in any process) are never evicted. Every evicted
    day is rebuilt from the log when it is next asked for.
    """
    store = worlds(ctx)
    report = store.cache_prune(max_size)
    days = store.cache_stats()[1] if not as_json else {}
    if as_json:
        render.emit_json(prune_dict(report))
    else:
        render.echo(prune_text(report, days))


# --- rendering ----------------------------------------------------------------------------


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _entry_dict(entry: CachedEntry, days: dict[str, list[str]] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"world_hash": entry.world_hash, "bytes": entry.bytes,
                             "last_used": _when(entry.last_used_ns), "pinned": entry.pinned}
    if days is not None:
        found["days"] = days.get(entry.world_hash, [])
    return found


def _by_persona(found: CacheStats, days: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    """Entries and bytes per persona (a world two personas share counts for both)."""
    personas: dict[str, dict[str, int]] = {}
    for entry in found.entries:
        names = sorted({d.split("@", 1)[0] for d in days.get(entry.world_hash, [])}) or [NO_DAY]
        for name in names:
            row = personas.setdefault(name, {"entries": 0, "bytes": 0})
            row["entries"] += 1
            row["bytes"] += entry.bytes
    return dict(sorted(personas.items()))


def stats_dict(found: CacheStats, days: dict[str, list[str]]) -> dict[str, Any]:
    entries = found.entries
    return {
        "root": str(found.root),
        "max_bytes": found.max_bytes,
        "entries": len(entries),
        "total_bytes": found.total_bytes,
        "pinned_entries": len(found.pinned),
        "pinned_bytes": sum(e.bytes for e in found.pinned),
        "oldest_use": _when(entries[0].last_used_ns) if entries else None,
        "newest_use": _when(entries[-1].last_used_ns) if entries else None,
        "personas": _by_persona(found, days),
        "snapshots": [_entry_dict(e, days) for e in entries],
    }


def stats_text(found: CacheStats, days: dict[str, list[str]]) -> str:
    entries = found.entries
    share = f" ({100 * found.total_bytes / found.max_bytes:.0f}%)" if found.max_bytes else ""
    lines = [
        f"snapshot cache  {found.root}",
        f"entries         {len(entries)} ({len(found.pinned)} pinned by open instances, "
        f"{format_size(sum(e.bytes for e in found.pinned))})",
        f"total           {format_size(found.total_bytes)} of a "
        f"{format_size(found.max_bytes)} cap{share}",
    ]
    if entries:
        for label, entry in (("oldest use", entries[0]), ("newest use", entries[-1])):
            named = ", ".join(days.get(entry.world_hash, [])[:3]) or NO_DAY
            lines.append(f"{label:<16}{_when(entry.last_used_ns)}  {entry.world_hash}  {named}")
        rows = [[name, str(row["entries"]), format_size(row["bytes"])]
                for name, row in _by_persona(found, days).items()]
        lines += ["", render.table(["persona", "entries", "bytes"], rows)]
    return "\n".join(lines)


def prune_dict(report: PruneReport) -> dict[str, Any]:
    return {
        "max_bytes": report.max_bytes,
        "evicted": [_entry_dict(e) for e in report.evicted],
        "freed_bytes": report.freed_bytes,
        "pinned_kept": [_entry_dict(e) for e in report.pinned],
        "total_bytes": report.total_bytes,
    }


def prune_text(report: PruneReport, days: dict[str, list[str]]) -> str:
    lines = [f"evicted {e.world_hash}  {format_size(e.bytes)}  "
             f"{', '.join(days.get(e.world_hash, [])[:3]) or NO_DAY}" for e in report.evicted]
    lines.append(f"freed {format_size(report.freed_bytes)} ({len(report.evicted)} snapshots); "
                 f"the cache holds {format_size(report.total_bytes)}, limit "
                 f"{format_size(report.max_bytes)}")
    if report.pinned:
        lines.append(f"kept {len(report.pinned)} pinned snapshots "
                     f"({format_size(sum(e.bytes for e in report.pinned))}) that open instances "
                     "use")
    return "\n".join(lines)
