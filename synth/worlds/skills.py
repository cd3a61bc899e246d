"""The skill library of persona-world synthesis (methods.md section 4): what earlier days
showed works, and what earlier refusals taught, for the implementer of the next day.

A skill is one of:

* ``interface``: a tool call that worked, with the arguments it took (an example);
* ``state_change``: an SQL statement that changed a service's rows (how a state change
  that no tool makes was written);
* ``constraint``: a cross-record consistency rule of a table the day wrote (a foreign
  key: which row a column must name);
* ``lesson``: why an attempt at a day, or a task, was refused (the check's own words).

Skills are derived from stored outputs only, never by a model: from the episode of a
stored day (its successful calls, the snapshot's schema), from the refusals of a day's
attempts and from the gates' rejections of tasks. The library is the run's
``skills.jsonl``, one skill per line in the order learnt, each once (by its key, the
digest of its kind and text). ``retrieve`` picks a plan's skills: those sharing the most
tools, then services, with the plan's activities, and the latest lessons, bounded; it is a
pure function of the library and the plan, so a replay retrieves the same ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import apsw
import msgspec

from replay.layout import service_db
from replay.sqlite import open_readonly, quote_ident
from synth.stage import write_atomically
from synth.worlds.plans import PlanOut
from worldenv.core.episode import DbChange, Episode, ToolCall
from worldenv.instances.instance import SQL_CALL

SKILLS_FILE = "skills.jsonl"
MAX_SKILLS = 12  # retrieved for one plan, lessons included
MAX_LESSONS = 4
TEXT_CHARS = 400
Kind = Literal["interface", "state_change", "constraint", "lesson"]


class Skill(msgspec.Struct, frozen=True):
    kind: Kind
    text: str
    services: list[str]
    tools: list[str]
    source: str  # "persona@day", or "task <task_id>"

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.kind}\n{self.text}".encode()).hexdigest()[:16]


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 4] + " ..."


def _service_of(tool: str, services: Iterable[str]) -> str | None:
    return next((s for s in sorted(services) if tool.startswith(f"{s}_")), None)


def skills_of_day(episode: Episode, snapshot: Path, services: Sequence[str], source: str
                  ) -> list[Skill]:
    """The interface, state-change and constraint skills a stored day's episode shows
    (`snapshot`: the day's world, whose schema gives the constraints)."""
    found: list[Skill] = []
    changes = [e for e in episode.events if isinstance(e, DbChange)]
    changed = {e.index for e in changes}
    written = {(e.service, str(c.name)) for e in changes
               for c in apsw.Changeset.iter(e.changeset)}
    for call in episode.calls:
        if not isinstance(call, ToolCall) or call.is_error:
            continue
        if call.tool == SQL_CALL:
            if call.index not in changed:
                continue
            service = str(call.arguments.get("service"))
            sql = str(call.arguments.get("sql"))
            found.append(Skill("state_change", _cut(f"{service}: {sql}"), [service], [],
                               source))
            continue
        owner = _service_of(call.tool, services)
        example = json.dumps(call.arguments, sort_keys=True, ensure_ascii=False)
        found.append(Skill("interface", _cut(f"{call.tool} works with arguments {example}"),
                           [owner] if owner else [], [call.tool], source))
    for service, table in sorted(written):
        found += _constraints(snapshot, service, table, source)
    return _unique(found)


def _constraints(snapshot: Path, service: str, table: str, source: str) -> list[Skill]:
    with open_readonly(service_db(snapshot, service)) as conn:
        keys = list(conn.execute(f"PRAGMA foreign_key_list({quote_ident(table)})"))
    return [Skill("constraint", f"{service}.{table}.{row[3]} must name a row of "
                               f"{service}.{row[2]} ({row[4] or 'its key'})",
                  [service], [], source) for row in sorted(keys, key=lambda r: (r[3], r[2]))]


def lesson(problem: str, source: str, services: Sequence[str] = ()) -> Skill:
    return Skill("lesson", _cut(problem), sorted(services), [], source)


def _unique(skills: Iterable[Skill]) -> list[Skill]:
    seen: set[str] = set()
    out = []
    for skill in skills:
        if skill.key not in seen:
            seen.add(skill.key)
            out.append(skill)
    return out


def read_skills(folder: Path) -> list[Skill]:
    path = folder / SKILLS_FILE
    if not path.is_file():
        return []
    return [msgspec.json.decode(line, type=Skill) for line in path.read_bytes().splitlines()
            if line.strip()]


def add_skills(folder: Path, new: Sequence[Skill]) -> int:
    """Add the skills the library lacks (by key), after the others; how many were new."""
    have = read_skills(folder)
    merged = _unique([*have, *new])
    if len(merged) != len(have):
        write_atomically(folder / SKILLS_FILE,
                         b"".join(msgspec.json.encode(s) + b"\n" for s in merged))
    return len(merged) - len(have)


def retrieve(skills: Sequence[Skill], plan: PlanOut, services: Sequence[str]) -> list[Skill]:
    """A plan's skills: by tools shared with its activities, then services shared with
    the persona's, then the latest first; and the latest lessons."""
    tools = {a.tool for a in plan.activities if a.tool}
    wanted = set(services)
    lessons = [s for s in skills if s.kind == "lesson"][-MAX_LESSONS:]
    scored = []
    for order, skill in enumerate(skills):
        if skill.kind == "lesson":
            continue
        score = 2 * len(tools & set(skill.tools)) + len(wanted & set(skill.services))
        if score:
            scored.append((-score, -order, skill))
    scored.sort(key=lambda s: (s[0], s[1]))
    return [s for _, _, s in scored[: MAX_SKILLS - len(lessons)]] + lessons


def skills_text(skills: Sequence[Skill]) -> str:
    return "\n".join(f"- [{s.kind}] {s.text} ({s.source})" for s in skills)


__all__ = ["MAX_SKILLS", "SKILLS_FILE", "Skill", "add_skills", "lesson", "read_skills",
           "retrieve", "skills_of_day", "skills_text"]
