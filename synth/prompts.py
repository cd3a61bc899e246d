"""The prompts of the synthesis stages: one file per stage in ``synth/prompts/``.

A prompt file starts with its version and a ``---`` line::

    version: 3
    ---
    <the system prompt>

The version is part of every recording key (the system message names the prompt and its
version) and of every stage output's key, so changing a prompt's text means giving it a
new version, and a run made with the old one is never mistaken for the new.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from synth.errors import SynthError

PROMPTS = Path(__file__).resolve().parent / "prompts"
# The stages of environment synthesis, in order; each has its prompt file (here, so that
# the command line can offer them without importing the stages).
ENV_STAGES = ("tasks", "schema", "data", "spec", "code", "verifier")
_HEADER = re.compile(r"version: ([0-9]+)\n---\n")


@dataclass(frozen=True, slots=True)
class Prompt:
    stage: str
    version: int
    text: str

    @property
    def tag(self) -> str:
        return f"{self.stage}@v{self.version}"

    def system(self) -> str:
        """The system message: the prompt, headed by its name and version."""
        return f"[agent-worlds synth prompt {self.tag}]\n{self.text}"


@cache
def prompt(stage: str) -> Prompt:
    """The prompt of `stage` (``synth/prompts/<stage>.md``)."""
    path = PROMPTS / f"{stage}.md"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SynthError(f"{path}: no prompt for stage {stage!r}") from None
    found = _HEADER.match(text)
    if found is None:
        raise SynthError(f"{path}:1: a prompt file starts with 'version: N' and a '---' line")
    return Prompt(stage, int(found.group(1)), text[found.end():].strip() + "\n")


def versions() -> dict[str, int]:
    """Every prompt's version, by stage (recorded in a run's configuration)."""
    return {p.stem: prompt(p.stem).version for p in sorted(PROMPTS.glob("*.md"))}


__all__ = ["ENV_STAGES", "PROMPTS", "Prompt", "prompt", "versions"]
