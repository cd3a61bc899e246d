"""The papers' evaluation protocols, as ``eval run --protocol awm|wildawm`` applies them.

A protocol fixes how the LLM agent is run: its interface mode, how it samples, how many
steps it may take and what history it keeps. The numbers are the papers' (see
``methods.md`` sections 3 and 6 of the reference)::

    awm      AWM's own meta-tool mode (list_tools once and first, then call_tool), sampled at
             temperature 0.6, top-k 20, top-p 0.95; the system prompt, the task, the
             list_tools exchange and the 10 most recent turns; at most 20 turns
    wildawm  the tools mode (MCP tools, shell, answer; GUI tools for a gui task); at most
             256 steps (the paper allows 512 for its longest benchmarks: --max-steps 512);
             a 102,400-token context with automatic compaction: past 76,800 tokens (three
             quarters, as the training preset compacts: the paper does not say when) the
             history is summarised and the rollout goes on from the summary; no window.
             The paper states no sampling parameters for evaluation: the agent's greedy
             default stays.

Explicit ``--max-steps`` and ``--history`` win over the protocol's values. Without a
protocol the agent runs as it always has: tools mode, temperature 0, 20 steps, a window of
10. The protocol is part of a run's configuration (``eval.runner.run_id_of``): a run folder
of another protocol is refused on resume.
"""

from __future__ import annotations

from dataclasses import dataclass

from eval.errors import EvalError
from gates.compaction import COMPACT_FRACTION
from gates.llm_agent import Mode, Sampling


@dataclass(frozen=True)
class EvalProtocol:
    """How the LLM agent runs under a protocol. `history` is the window of recent steps
    (0: all of them); `compact_at` the context in tokens past which it is compacted (0:
    never); `context` the context the paper gives the model (None: not limited here)."""

    name: str
    mode: Mode
    sampling: Sampling
    max_steps: int
    history: int
    compact_at: int = 0
    context: int | None = None

    def limits(self, max_steps: int | None, history: int | None) -> tuple[int, int]:
        """(max steps, history window) of a run: the explicit values where given (they
        win), the protocol's otherwise."""
        return (self.max_steps if max_steps is None else max_steps,
                self.history if history is None else history)


AWM = EvalProtocol(name="awm", mode="meta",
                   sampling=Sampling(temperature=0.6, top_p=0.95, top_k=20),
                   max_steps=20, history=10)
WILDAWM_CONTEXT = 102_400
WILDAWM = EvalProtocol(name="wildawm", mode="tools", sampling=Sampling(), max_steps=256,
                       history=0, compact_at=int(WILDAWM_CONTEXT * COMPACT_FRACTION),
                       context=WILDAWM_CONTEXT)
PROTOCOLS: dict[str, EvalProtocol] = {p.name: p for p in (AWM, WILDAWM)}
# Without a protocol: the agent's own defaults (the run identity of runs made before
# protocols existed).
DEFAULT = EvalProtocol(name="", mode="tools", sampling=Sampling(), max_steps=20, history=10)


def protocol(name: str | None) -> EvalProtocol:
    """The protocol `name` names (None: the defaults); EvalError naming the known ones."""
    if name is None:
        return DEFAULT
    found = PROTOCOLS.get(name)
    if found is None:
        raise EvalError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}")
    return found


__all__ = ["AWM", "DEFAULT", "PROTOCOLS", "WILDAWM", "EvalProtocol", "protocol"]
