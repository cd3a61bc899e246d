"""Stage 1 of environment synthesis: scenarios from seed names (methods.md section 2).

Self-Instruct expansion: each round shows the model a window of the pool (the seeds, then
the scenarios kept so far) and asks for ``batch`` new ones. Each candidate then passes
four filters, in order, and the first that refuses it is recorded as the reason:

1. **well-formed**: a snake_case name not taken by a seed or a kept scenario, a
   description of ``DESCRIPTION_WORDS`` words, a category;
2. **classifier**: a separate LLM call per candidate rejects content-centric and
   read-only scenarios (the classifier's category is the one kept);
3. **duplicate**: embeddings (litellm, through the recording client) reject a candidate
   whose cosine similarity to a seed or to a kept scenario is ``DUPLICATE_COSINE`` or more;
4. **category cap**: at most ``cap`` scenarios per category.

Rounds go on until ``n`` are kept or ``max_rounds`` have run. Everything is sequential
and a function of the recordings, so the kept list replays exactly.

The seeds file is AWM's format (``outputs/seed_scenario.jsonl``): one JSON object per
line with ``name`` and ``description``; ``synth/seeds/seed_scenario.jsonl`` ships 100.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from synth.environments.database import ScenarioSpec
from synth.errors import SynthError
from synth.stage import Context, Measure, Stage, run_stage

SEEDS = Path(__file__).resolve().parent.parent / "seeds" / "seed_scenario.jsonl"
DUPLICATE_COSINE = 0.85
DESCRIPTION_WORDS = (20, 250)
BATCH = 10
EXAMPLES = 8
_NAME = re.compile(r"[a-z][a-z0-9_]{1,63}\Z")


class Seed(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    description: str


T = TypeVar("T", Seed, ScenarioSpec)


def read_seeds(path: Path) -> list[Seed]:
    """AWM's seed file: one {"name", "description"} object per line; SynthError naming
    the file and line of anything else."""
    return _read_lines(path, Seed, "seeds", '{"name", "description"}', snake_case=False)


def read_scenarios(path: Path) -> list[ScenarioSpec]:
    """scenarios.jsonl as ``synth scenarios`` writes it; SynthError naming file and line."""
    return _read_lines(path, ScenarioSpec, "scenarios",
                       '{"name", "description", "category"}', snake_case=True)


def _read_lines(path: Path, kind: type[T], what: str, shape: str, *,
                snake_case: bool) -> list[T]:
    """The objects of a JSON Lines file of `what`, each a `kind` with a name not given
    before (snake_case, when asked: a scenario's name becomes its persona's) and a
    description. Seeds are names as a site is called (AWM's are free text)."""
    found: list[T] = []
    seen: dict[str, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SynthError(f"{path}: cannot read the {what} file: {exc}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = msgspec.json.decode(line.encode(), type=kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise SynthError(f"{path}:{number}: not a line of {what} ({shape}): "
                             f"{exc}") from None
        if not item.name.strip():
            raise SynthError(f"{path}:{number}: the name is empty")
        if snake_case and not _NAME.match(item.name):
            raise SynthError(f"{path}:{number}: name {item.name!r} is not snake_case (a-z, "
                             "0-9, _; 2 to 64 characters)")
        if not item.description.strip():
            raise SynthError(f"{path}:{number}: {item.name} has no description")
        if item.name in seen:
            raise SynthError(f"{path}:{number}: {item.name!r} is on line "
                             f"{seen[item.name]} already")
        seen[item.name] = number
        found.append(item)
    if not found:
        raise SynthError(f"{path}: the {what} file is empty")
    return found


# --- the stages -----------------------------------------------------------------------


class ScenariosOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    scenarios: list[ScenarioSpec]


def candidate_problem(spec: ScenarioSpec, taken: set[str]) -> str | None:
    lo, hi = DESCRIPTION_WORDS
    words = len(spec.description.split())
    if not _NAME.match(spec.name):
        return f"name {spec.name!r} is not snake_case (a-z, 0-9, _; 2 to 64 characters)"
    if spec.name in taken:
        return f"name {spec.name} is taken by a seed or an earlier scenario"
    if not lo <= words <= hi:
        return f"{spec.name}: the description has {words} words; {lo} to {hi} are asked for"
    if not spec.category.strip():
        return f"{spec.name}: no category"
    return None


class ExpandStage(Stage[ScenariosOut]):
    name = "scenarios"
    threshold = 0.5  # a round is kept when most of its candidates are well-formed
    keeps_best = True
    output_type = ScenariosOut

    def __init__(self, round_no: int, examples: Sequence[ScenarioSpec], batch: int,
                 taken: set[str]) -> None:
        self.round_no = round_no
        self.examples = list(examples)
        self.batch = batch
        self.taken = set(taken)

    def inputs(self) -> Any:
        return {"round": self.round_no, "batch": self.batch, "taken": sorted(self.taken),
                "examples": [msgspec.to_builtins(e) for e in self.examples]}

    def request(self) -> str:
        shown = "\n".join(f"- {e.name}: {e.description}" for e in self.examples)
        return (f"Example scenarios:\n{shown}\n\nNames already taken: "
                f"{', '.join(sorted(self.taken))}\n\nWrite exactly {self.batch} new scenarios.")

    def execute(self, output: ScenariosOut) -> Measure:
        problems: list[str] = []
        taken = set(self.taken)
        for spec in output.scenarios:
            problem = candidate_problem(spec, taken)
            if problem is not None:
                problems.append(problem)
            taken.add(spec.name)
        given = len(output.scenarios)
        missing = max(0, self.batch - given)
        counted = [] if given == self.batch else [
            f"{given} scenarios given; {self.batch} were asked for"]
        return Measure(min(1.0, (len(problems) + missing) / self.batch),
                       tuple(counted + problems), {"given": given})


class ClassifyOut(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    accept: bool
    content_centric: bool
    read_only: bool
    category: str
    reason: str


class ClassifyStage(Stage[ClassifyOut]):
    name = "classify"
    threshold = 0.0
    output_type = ClassifyOut
    max_tokens = 512

    def __init__(self, spec: ScenarioSpec) -> None:
        self.spec = spec

    def inputs(self) -> Any:
        return msgspec.to_builtins(self.spec)

    def request(self) -> str:
        return f"Scenario: {self.spec.name}\n\n{self.spec.description}"

    def execute(self, output: ClassifyOut) -> Measure:
        if output.accept and (output.content_centric or output.read_only):
            return Measure(1.0, ("accept is true but the scenario is said to be "
                                 "content-centric or read-only: these contradict",))
        if not output.category.strip():
            return Measure(1.0, ("no category",))
        return Measure(0.0)


# --- the expansion --------------------------------------------------------------------


@dataclass
class ScenarioReport:
    kept: list[ScenarioSpec] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"kept": [msgspec.to_builtins(s) for s in self.kept], "rejected": self.rejected,
                "rounds": self.rounds}


def default_cap(n: int) -> int:
    """Per-category cap: a fifth of the scenarios asked for, at least 2."""
    return max(2, math.ceil(n / 5))


def expand(ctx: Context, seeds: Sequence[Seed], n: int, *, cap: int | None = None,
           batch: int = BATCH, examples: int = EXAMPLES,
           max_rounds: int | None = None) -> ScenarioReport:
    """Scenarios from `seeds` until `n` are kept (see the module docstring)."""
    if n < 1:
        raise SynthError(f"-n {n}: at least one scenario is asked for")
    cap = default_cap(n) if cap is None else cap
    rounds = max_rounds if max_rounds is not None else 3 * math.ceil(n / batch) + 2
    seed_specs = [ScenarioSpec(s.name, s.description, "seed") for s in seeds]
    report = ScenarioReport()
    vectors = ctx.embed([_embedding_text(s) for s in seed_specs]).vectors
    taken = {s.name for s in seed_specs}
    per_category: dict[str, int] = {}
    for round_no in range(rounds):
        if len(report.kept) >= n:
            break
        report.rounds = round_no + 1
        pool = seed_specs + report.kept
        start = (round_no * examples) % len(pool)
        window = (pool[start:] + pool[:start])[:examples]
        ctx.progress.expect("scenarios")
        outcome = run_stage(ctx, ExpandStage(round_no, window, batch, taken),
                            f"round-{round_no + 1}")
        ctx.progress.done("scenarios", outcome.status == "accepted")
        if outcome.output is None:
            continue
        candidates = msgspec.convert(outcome.output, type=ScenariosOut).scenarios
        for spec in candidates:
            if len(report.kept) >= n:
                break
            problem = candidate_problem(spec, taken)
            taken.add(spec.name)
            if problem is not None:
                report.rejected.append({"name": spec.name, "filter": "well-formed",
                                        "reason": problem})
                continue
            kept = _filter(ctx, spec, vectors, seed_specs + report.kept, per_category, cap,
                           report)
            if kept is not None:
                report.kept.append(kept[0])
                vectors.append(kept[1])
    return report


def _filter(ctx: Context, spec: ScenarioSpec, vectors: list[list[float]],
            pool: Sequence[ScenarioSpec], per_category: dict[str, int], cap: int,
            report: ScenarioReport) -> tuple[ScenarioSpec, list[float]] | None:
    """The candidate as kept (with the classifier's category) and its embedding, or
    None (the rejection recorded)."""
    verdict = run_stage(ctx, ClassifyStage(spec), spec.name)
    if verdict.output is None or verdict.status != "accepted":
        report.rejected.append({"name": spec.name, "filter": "classifier",
                                "reason": "the classifier gave no usable answer"})
        return None
    answer = msgspec.convert(verdict.output, type=ClassifyOut)
    if not answer.accept:
        kind = ("content-centric" if answer.content_centric else
                "read-only" if answer.read_only else "not stateful enough")
        report.rejected.append({"name": spec.name, "filter": "classifier",
                                "reason": f"{kind}: {answer.reason}"})
        return None
    vector = ctx.embed([_embedding_text(spec)]).vectors[0]
    best, similar = _nearest(vector, vectors)
    if best >= DUPLICATE_COSINE:
        report.rejected.append({"name": spec.name, "filter": "duplicate",
                                "reason": f"cosine {best:.3f} to {pool[similar].name} "
                                          f"(>= {DUPLICATE_COSINE})"})
        return None
    category = " ".join(answer.category.lower().split())
    if per_category.get(category, 0) >= cap:
        report.rejected.append({"name": spec.name, "filter": "category cap",
                                "reason": f"category {category!r} has {cap} scenarios "
                                          "already (the cap)"})
        return None
    per_category[category] = per_category.get(category, 0) + 1
    return ScenarioSpec(spec.name, spec.description, category), vector


def _embedding_text(spec: ScenarioSpec) -> str:
    return f"{spec.name.replace('_', ' ')}: {spec.description}"


def _nearest(vector: Sequence[float], others: Sequence[Sequence[float]]) -> tuple[float, int]:
    best, where = -1.0, -1
    for i, other in enumerate(others):
        sim = cosine(vector, other)
        if sim > best:
            best, where = sim, i
    return best, where


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


__all__ = ["DUPLICATE_COSINE", "SEEDS", "ClassifyOut", "ClassifyStage", "ExpandStage",
           "ScenarioReport", "ScenariosOut", "Seed", "cosine", "default_cap", "expand",
           "read_scenarios", "read_seeds"]
