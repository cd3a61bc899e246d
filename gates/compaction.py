"""Context compaction (WildAWM): when a rollout's context grows past a limit, a separate
model call summarises the work so far, and the rollout goes on from the system prompt,
the task and that summary.

The LLM agent (``gates.llm_agent``, at evaluation) and the RL agent loop
(``rl.verl_loop``, in training) both compact; the prompt, the transcript the summariser
reads and the message that carries the summary are made here, once, so that a policy is
evaluated on the same compacted contexts it was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

COMPACT_PROMPT = """\
You are summarising an agent's work so far, so that it can continue with a shorter \
context. Write what the task is, what has been done (with every id, name, number and file \
path found or changed), what is left to do, and anything learned that matters. Be \
complete and concise; do not call tools."""
SUMMARY_PREFIX = "Summary of the work so far (the earlier context was compacted):\n"
# WildAWM compacts "automatically" without saying when: at three quarters of the context,
# a quarter stays free for the step that crosses the threshold and for the summary call
# (the training preset, rl.config, compacts at the same fraction).
COMPACT_FRACTION = 0.75


def compaction_prompt(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summariser's request: its own system prompt, then the context to summarise
    (every message after the agent's system prompt) as one JSON transcript."""
    transcript = json.dumps(list(messages), ensure_ascii=False, indent=1)
    return [{"role": "system", "content": COMPACT_PROMPT},
            {"role": "user", "content": transcript}]


def summary_message(summary: str) -> dict[str, Any]:
    """The message that stands for the compacted context, after the task."""
    return {"role": "user", "content": SUMMARY_PREFIX + summary}


__all__ = ["COMPACT_FRACTION", "COMPACT_PROMPT", "SUMMARY_PREFIX", "compaction_prompt",
           "summary_message"]
