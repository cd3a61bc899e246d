"""Persona bibles (methods.md section 4): whose computer a world is, checked before any day
of it is made.

A bible names the persona, an occupation and a life domain, at least three named
contacts, the services it uses, 2-5 story arcs that each span several days (at least one
decided by an image in the workspace) and its web accounts. ``BibleStage`` asks the model
for one and checks it (``bible_problems``): the counts above, and *grounding*: every
service is one the app library serves, and every tool an arc needs is a tool of one of
the bible's services, so a day plan can only ask for what the world can do. The stage
self-corrects like every stage (``synth.stage``).

A checked bible then meets the **diversity judge** (``DiversityStage``, an LLM call with
the candidate's signature and every accepted persona's): it rejects a candidate that
shares occupation and life domain, or the core tool pattern, or a story arc, with an
accepted persona, naming which and with whom. A rejection goes back to the bible stage as
feedback, at most ``MAX_REVISIONS`` times. Two cheap checks run before the judge and need
no model: a name already taken, and a signature equal to an accepted one's.

Accounts get deterministic password hashes: PBKDF2-HMAC-SHA256 with a fixed salt derived
from the persona's name and written into its accounts file (``accounts.json``: the salt,
and per account the service, user name, password and hash), so replaying a day that
inserts a hash gives the same bytes everywhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import msgspec

from synth.stage import Context, Measure, Stage, StageOutcome, run_stage
from worldstore.errors import WorldError
from worldstore.names import MAX_NAME, check_relpath, is_persona

MIN_CONTACTS = 3
ARCS = (2, 5)
MAX_REVISIONS = 2
PBKDF2_ITERATIONS = 100_000
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
ACCOUNTS_FILE = "accounts.json"
Shares = Literal["occupation_and_domain", "tool_pattern", "arc"]


class ContactOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    relation: str


class ArcOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    title: str
    days: list[int]
    summary: str
    tools: list[str]
    image: str | None = None  # the workspace file that decides the arc, if one does


class AccountOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    service: str
    username: str
    password: str


class BibleOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    occupation: str
    life_domain: str
    contacts: list[ContactOut]
    services: list[str]
    arcs: list[ArcOut]
    accounts: list[AccountOut]


def signature(bible: BibleOut) -> str:
    """The compact signature the diversity judge compares: who, which tools, which arcs."""
    return (f"{bible.name}: {bible.occupation.strip().lower()} / "
            f"{bible.life_domain.strip().lower()} / uses {'+'.join(sorted(bible.services))} / "
            f"arcs: {'; '.join(a.title.strip() for a in bible.arcs)}")


def library_tools(apps: Mapping[str, Any]) -> dict[str, list[str]]:
    """The app library as a bible is grounded in: each service's tool names, as agents
    see them (``<service>_<tool>``)."""
    return {service: sorted(spec.full_name for spec in app.tools.values())
            for service, app in sorted(apps.items())}


def bible_problems(bible: BibleOut, library: Mapping[str, Sequence[str]]) -> list[str]:
    """Why the bible cannot found a world (deterministic texts); empty when it can."""
    problems: list[str] = []
    if not is_persona(bible.name):
        problems.append(f"name {bible.name!r} is not a persona name: [a-z0-9][a-z0-9_-]*, "
                        f"at most {MAX_NAME} characters")
    for field in ("occupation", "life_domain"):
        if not getattr(bible, field).strip():
            problems.append(f"{field} is empty")
    distinct = {c.name.strip().lower() for c in bible.contacts if c.name.strip()}
    if len(distinct) < MIN_CONTACTS:
        problems.append(f"{len(distinct)} distinct named contacts; a bible names at least "
                        f"{MIN_CONTACTS}")
    unknown = sorted(set(bible.services) - set(library))
    if unknown:
        problems.append(f"services {', '.join(unknown)} are not in the app library "
                        f"({', '.join(sorted(library))})")
    if not bible.services:
        problems.append("no service is used")
    problems += _arc_problems(bible, library)
    problems += _account_problems(bible)
    return problems


def _arc_problems(bible: BibleOut, library: Mapping[str, Sequence[str]]) -> list[str]:
    problems = []
    low, high = ARCS
    if not low <= len(bible.arcs) <= high:
        problems.append(f"{len(bible.arcs)} story arcs; a bible has {low} to {high}")
    tools = {t for s in bible.services for t in library.get(s, ())}
    for i, arc in enumerate(bible.arcs, 1):
        where = f"arc {i} ({arc.title!r})"
        if len(set(arc.days)) < 2 or any(d < 1 for d in arc.days) or arc.days != sorted(
                set(arc.days)):
            problems.append(f"{where}: days {arc.days} must be two or more distinct days "
                            "from 1 on, ascending")
        missing = sorted(set(arc.tools) - tools)
        if missing:
            problems.append(f"{where}: tools {', '.join(missing)} are not tools of the "
                            "bible's services")
        if not arc.tools:
            problems.append(f"{where}: names no tool")
        if arc.image is not None:
            problems += _image_problems(where, arc.image)
    if not any(arc.image for arc in bible.arcs):
        problems.append("no arc is decided by an image in the workspace (give one arc an "
                        "'image')")
    return problems


def _image_problems(where: str, image: str) -> list[str]:
    try:
        check_relpath(image)
    except WorldError as exc:
        return [f"{where}: image {image!r}: {exc}"]
    if not image.lower().endswith(IMAGE_SUFFIXES):
        return [f"{where}: image {image!r} is not a {'/'.join(IMAGE_SUFFIXES)} file"]
    return []


def _account_problems(bible: BibleOut) -> list[str]:
    problems = []
    if not bible.accounts:
        problems.append("no web account")
    seen: set[tuple[str, str]] = set()
    for i, account in enumerate(bible.accounts, 1):
        where = f"account {i} ({account.service}/{account.username})"
        if account.service not in bible.services:
            problems.append(f"{where}: its service is not one the bible uses")
        if not account.username.strip() or not account.password:
            problems.append(f"{where}: a user name and a password are needed")
        if (account.service, account.username) in seen:
            problems.append(f"{where}: given twice")
        seen.add((account.service, account.username))
    return problems


# --- accounts ---------------------------------------------------------------------------


def accounts_salt(persona: str) -> str:
    """The persona's fixed salt (hex), as its accounts file records it."""
    return hashlib.sha256(f"agent-worlds accounts salt:{persona}".encode()).hexdigest()[:32]


def password_hash(password: str, salt: str) -> str:
    """``pbkdf2_sha256$<iterations>$<salt>$<hex>``: the same bytes on every machine."""
    derived = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), bytes.fromhex(salt),
                                  PBKDF2_ITERATIONS)
    return f"pbkdf2_sha256${PBKDF2_ITERATIONS}${salt}${derived.hex()}"


def accounts_file(bible: BibleOut) -> dict[str, Any]:
    """The persona's accounts file (``accounts.json`` in its workspace)."""
    salt = accounts_salt(bible.name)
    return {"salt": salt, "accounts": [
        {"service": a.service, "username": a.username, "password": a.password,
         "password_hash": password_hash(a.password, salt)} for a in bible.accounts]}


# --- the stages -------------------------------------------------------------------------


class BibleStage(Stage[BibleOut]):
    name = "persona"
    threshold = 0.0
    output_type: ClassVar[type] = BibleOut
    max_tokens = 4096

    def __init__(self, hint: str | None, library: Mapping[str, Sequence[str]],
                 accepted: Sequence[str], feedback: Sequence[str]) -> None:
        """`hint`: a name or idea for the persona (None: the model's choice); `accepted`:
        the signatures of the accepted personas; `feedback`: the diversity judge's
        rejections so far."""
        self.hint = hint
        self.library = {s: list(t) for s, t in sorted(library.items())}
        self.accepted = list(accepted)
        self.feedback = list(feedback)

    def inputs(self) -> Any:
        return {"hint": self.hint, "library": self.library, "accepted": self.accepted,
                "feedback": self.feedback}

    def request(self) -> str:
        lines = [f"Persona: {self.hint or 'your choice'}", "", "App library (service: tools):"]
        lines += [f"- {service}: {', '.join(tools)}" for service, tools in self.library.items()]
        lines += ["", "Accepted personas (be unlike each):"]
        lines += [f"- {s}" for s in self.accepted] or ["- none yet"]
        if self.feedback:
            lines += ["", "The diversity judge rejected earlier candidates:"]
            lines += [f"- {f}" for f in self.feedback]
        return "\n".join(lines)

    def execute(self, output: BibleOut) -> Measure:
        problems = bible_problems(output, self.library)
        checks = 8 + len(output.arcs) + len(output.accounts)
        return Measure(min(1.0, len(problems) / checks), tuple(problems),
                       {"contacts": len(output.contacts), "arcs": len(output.arcs),
                        "services": sorted(output.services)})


class DiversityOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    verdict: Literal["accept", "reject"]
    shares: Shares | None = None
    with_persona: str | None = None
    feedback: str = ""


class DiversityStage(Stage[DiversityOut]):
    name = "diversity"
    threshold = 0.0
    output_type: ClassVar[type] = DiversityOut
    max_tokens = 1024

    def __init__(self, candidate: str, accepted: Mapping[str, str]) -> None:
        self.candidate = candidate
        self.accepted = dict(sorted(accepted.items()))

    def inputs(self) -> Any:
        return {"candidate": self.candidate, "accepted": self.accepted}

    def request(self) -> str:
        lines = [f"Candidate: {self.candidate}", "", "Accepted personas:"]
        lines += [f"- {s}" for s in self.accepted.values()]
        return "\n".join(lines)

    def execute(self, output: DiversityOut) -> Measure:
        """A verdict is well-formed when a rejection says what is shared and with whom."""
        if output.verdict == "accept":
            return Measure(0.0)
        errors = []
        if output.shares is None:
            errors.append("a rejection must say what is shared ('shares')")
        if output.with_persona not in self.accepted:
            errors.append(f"a rejection must name an accepted persona ('with_persona': one "
                          f"of {', '.join(self.accepted)}), not {output.with_persona!r}")
        return Measure(1.0 if errors else 0.0, tuple(errors))


# --- one persona --------------------------------------------------------------------------


@dataclass
class PersonaResult:
    """One persona's synthesis: ``accepted`` with its bible, or why not."""

    status: Literal["accepted", "rejected", "failed"]
    bible: BibleOut | None
    reason: str
    revisions: int
    outcomes: list[StageOutcome]

    @property
    def signature(self) -> str | None:
        return signature(self.bible) if self.bible is not None else None


def synthesize_persona(ctx: Context, library: Mapping[str, Sequence[str]],
                       accepted: Mapping[str, str], hint: str | None = None) -> PersonaResult:
    """A bible (self-corrected), then the diversity judge, with at most MAX_REVISIONS
    revisions on its feedback. `accepted` maps accepted personas' names to signatures."""
    feedback: list[str] = []
    outcomes: list[StageOutcome] = []
    for revision in range(MAX_REVISIONS + 1):
        made = run_stage(ctx, BibleStage(hint, library, list(accepted.values()), feedback),
                         hint or "persona")
        outcomes.append(made)
        if made.status != "accepted":
            why = "; ".join(made.attempts[-1].errors[:3]) if made.attempts else "no reply"
            return PersonaResult("failed", None, f"the bible was not accepted: {why}",
                                 revision, outcomes)
        bible = msgspec.convert(made.output, BibleOut)
        rejection = _plainly_taken(bible, accepted)
        if rejection is None and accepted:
            judged = run_stage(ctx, DiversityStage(signature(bible), accepted), bible.name)
            outcomes.append(judged)
            if judged.status != "accepted":
                return PersonaResult("failed", None, "the diversity judge gave no usable "
                                     "verdict", revision, outcomes)
            verdict = msgspec.convert(judged.output, DiversityOut)
            if verdict.verdict == "reject":
                rejection = (f"{bible.name} shares {verdict.shares} with "
                             f"{verdict.with_persona}: {verdict.feedback}".rstrip(": "))
        if rejection is None:
            return PersonaResult("accepted", bible, "", revision, outcomes)
        feedback.append(rejection)
    return PersonaResult("rejected", None, f"still too like an accepted persona after "
                         f"{MAX_REVISIONS} revisions: {feedback[-1]}", MAX_REVISIONS, outcomes)


def _plainly_taken(bible: BibleOut, accepted: Mapping[str, str]) -> str | None:
    """What needs no judge: a name already taken, a signature already accepted."""
    if bible.name in accepted:
        return f"the name {bible.name} is taken by an accepted persona; choose another"
    mine = signature(bible).split(": ", 1)[1]
    for name, other in accepted.items():
        if other.split(": ", 1)[-1] == mine:
            return f"{bible.name} has the very signature of {name}"
    return None


__all__ = [
    "ACCOUNTS_FILE",
    "MAX_REVISIONS",
    "AccountOut",
    "ArcOut",
    "BibleOut",
    "BibleStage",
    "ContactOut",
    "DiversityOut",
    "DiversityStage",
    "PersonaResult",
    "accounts_file",
    "accounts_salt",
    "bible_problems",
    "library_tools",
    "password_hash",
    "signature",
    "synthesize_persona",
]
