"""The contract of training: what a dataset row says, what a rollout's model steps are,
and what a training sample is. The agent loop (``rl.loop``) writes model steps, the
splitters (``rl.samples``) turn them into samples, the dataset writer (``rl.dataset``)
writes rows; none of them imports another's internals, only these types.

No verl or torch here: the dataset and sample code run (and are tested) without them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

AGENT_NAME = "agent_worlds"  # the agent loop's name in verl's registry and in every row
DATA_SOURCE_PREFIX = "agent_worlds/"  # a row's data_source: this + the pack's name
RewardKind = Literal["wildawm", "awm"]
HistoryKind = Literal["window", "compaction"]
Mode = Literal["tools", "meta"]


class RowInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``extra_info`` of a dataset row: everything the agent loop needs to open the task's
    world on any node and grade it, and nothing node-specific (no absolute paths)."""

    pack: str  # the pack's name (resolved with packs.registry.load_pack on the node)
    task_id: str  # the task folder's name inside the pack
    world: str  # persona@day of the task
    world_hash: str  # the task's start world: the loop refuses any other
    interfaces: list[str]  # the task's declared interfaces
    mode: Mode = "tools"  # the interface mode the model is offered
    reward: RewardKind = "wildawm"
    split: str = "rl"
    index: int = 0  # the row's position in its split


class ModelStep(msgspec.Struct, frozen=True):
    """One generate call of a rollout: the context tokens the model was given and the
    tokens it generated. ``kind`` is "compaction" for a call that summarised the history
    (WildAWM's context compaction), "action" otherwise. ``format_error`` marks the step
    whose output broke the format (the rollout stopped there)."""

    index: int
    kind: Literal["action", "compaction"]
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float] | None = None
    format_error: bool = False


class Sample(msgspec.Struct, frozen=True):
    """One training sequence cut from a rollout: ``prompt_ids`` then ``response_ids``,
    the loss on the response tokens whose ``response_mask`` is 1. ``steps`` are the model
    steps it covers; ``weight`` is what each of its trained tokens counts for in the
    rollout's token mean (1 / the rollout's trainable token count), so a rollout weighs
    the same however it was cut."""

    rollout_id: str
    steps: list[int]
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    weight: float


__all__ = ["AGENT_NAME", "DATA_SOURCE_PREFIX", "HistoryKind", "Mode", "ModelStep",
           "RewardKind", "RowInfo", "Sample"]
