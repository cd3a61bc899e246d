"""Exploring a booted world before making something from it (methods.md sections 4 and 5):
the day planner reads the world through day N-1, and task proposal the world at the
task's day, through read-only tools, not only through counts.

``explore`` is an agent with the reviewer's read-only tools over a world's snapshot
(``list_tables``, ``query``: SELECT only, ``list_files``, ``read_file``; the judges'
``WorldInspector``): at most ``MAX_TURNS`` model calls, then its findings (the reply
without a tool call, bounded). Its outcome is content-addressed like a stage's
(``RUN/outputs/explore/<key>.json``, the key over the prompt, the model, the world's hash
and the purpose), so a finished exploration is never paid twice, and everything it sends
is a function of the world and earlier replies: the run's replay explores the same way
from its recordings.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from gates.judges import WorldInspector
from synth.prompts import prompt
from synth.stage import Context, canonical_digest, encode, write_atomically
from synth.worlds.reviewer import READ_TOOLS, run_read_tool
from worldllm.client import Message, assistant_message

MAX_TURNS = 8
FINDINGS_CHARS = 3000
RESULT_CHARS = 4000  # of one tool result, as the explorer is shown it
STAGE = "explore"


class Exploration(msgspec.Struct, frozen=True):
    subject: str
    key: str
    prompt: str
    world_hash: str
    purpose: str
    findings: str  # "" when the explorer gave none within its turns
    calls: list[str]  # "<tool> <arguments>" of each call, in order
    turns: int
    tokens: int


def explore(ctx: Context, world: Path, world_hash: str, purpose: str, subject: str, *,
            max_turns: int = MAX_TURNS) -> Exploration:
    """The findings of exploring the snapshot `world` for `purpose` (stored, or made)."""
    tag = prompt(STAGE).tag
    key = canonical_digest({"stage": STAGE, "prompt": tag, "model": ctx.client.model,
                            "world": world_hash, "purpose": purpose, "turns": max_turns})
    path = ctx.outcome_path(STAGE, key)
    try:
        return msgspec.json.decode(path.read_bytes(), type=Exploration)
    except FileNotFoundError:
        pass
    inspector = WorldInspector({"final": world})
    messages: list[Message] = [
        {"role": "system", "content": prompt(STAGE).system()},
        {"role": "user", "content": f"Purpose: {purpose}\n\nThe world (called \"final\"): "
                                    f"services {', '.join(inspector.services('final'))}."}]
    calls: list[str] = []
    tokens, findings, turns = 0, "", 0
    while turns < max_turns:
        turns += 1
        ctx.budget.check()
        reply = ctx.client.complete(messages, tools=READ_TOOLS, temperature=0.0)
        if not reply.from_recording:
            ctx.budget.charge(reply.tokens_in + reply.tokens_out, reply.cost)
        tokens += reply.tokens_in + reply.tokens_out
        if not reply.tool_calls:
            findings = reply.text.strip()[:FINDINGS_CHARS]
            break
        messages.append(assistant_message(reply))
        for call in reply.tool_calls:
            calls.append(f"{call.name} {call.arguments}"[:300])
            result = run_read_tool(inspector, call.name, call.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": result[:RESULT_CHARS]})
    found = Exploration(subject=subject, key=key, prompt=tag, world_hash=world_hash,
                        purpose=purpose, findings=findings, calls=calls, turns=turns,
                        tokens=tokens)
    write_atomically(path, encode(found))
    return found


def findings_block(found: Exploration | None) -> str:
    """The findings as a block of a request ("" when there are none)."""
    if found is None or not found.findings:
        return ""
    return f"\n\nWhat exploring the world found:\n{found.findings}"


__all__ = ["MAX_TURNS", "STAGE", "Exploration", "explore", "findings_block"]
