"""Training samples cut from a rollout's model steps: AWM's per-step samples and WildAWM's
segment samples (methods.md sections 3 and 6).

A rollout of T generate calls is a list of ``ModelStep``: step t was given the context
``p_t`` (``prompt_ids``) and generated ``o_t`` (``output_ids``).

History-aware training (AWM): T samples, sample t = (prompt p_t, response o_t, mask 1).
The model saw a truncated history at inference, so each turn is trained on exactly the
context it was generated from.

Segment-wise training (WildAWM): step t+1 *continues* step t when

    p_{t+1}[: |p_t| + |o_t|] == p_t + o_t        (token-exact prefix)

and neither is a compaction call (the summariser's call has a context of its own). A
segment is a maximal run of continuing steps a..b; it becomes one sample

    prompt   = p_a
    response = o_a g_a o_{a+1} g_{a+1} ... o_b,   g_t = p_{t+1}[|p_t| + |o_t| :]

with mask 1 on every o_t and mask 0 on the tool results, observations and templates g_t
(logprob 0.0 there). prompt + response is p_b + o_b: one forward pass trains all of the
segment's turns, each conditioned on its own earlier outputs, so forward passes drop
from T to the number of segments M.

Weights: a rollout's loss is a token mean over its trained tokens, so every sample of the
rollout carries weight w = 1 / N, N = the rollout's mask-1 token count over all its
samples; sum over samples of w * (mask-1 tokens) = 1, however many samples the rollout
was cut into (a rollout with many compactions weighs what one without does).

Format failures (WildAWM: "gradient only on the offending step's tokens"): the rollout
stopped at the step whose output broke the format, its last step. Both splitters then
return one sample, that step's (prompt p_T, response o_T), rather than the other samples
with mask 0: the gradient is the same and the masked samples would cost forward passes
for nothing. For a segment this is also the same sequence (p_T + o_T), with the earlier
outputs in the prompt instead of masked.

Malformed input raises ``gates.errors.RewardError`` naming the step: such a rollout has
no samples, and none are guessed.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gates.errors import RewardError
from rl.contract import ModelStep, Sample

_KINDS = ("action", "compaction")


def history_samples(rollout_id: str, steps: Sequence[ModelStep], *,
                    format_failure: bool = False) -> list[Sample]:
    """One sample per step, loss on its own output (AWM); on a format failure only the
    offending (last) step's sample."""
    _check_rollout(steps, format_failure)
    chosen = [steps[-1]] if format_failure else list(steps)
    return _weighted([_step_sample(rollout_id, step) for step in chosen])


def segment_samples(rollout_id: str, steps: Sequence[ModelStep], *,
                    format_failure: bool = False) -> list[Sample]:
    """One sample per segment (a maximal run of steps sharing one causal context,
    WildAWM); on a format failure only the offending (last) step's sample."""
    _check_rollout(steps, format_failure)
    if format_failure:
        return _weighted([_step_sample(rollout_id, steps[-1])])
    return _weighted([_segment_sample(rollout_id, run) for run in segments(steps)])


def segments(steps: Sequence[ModelStep]) -> list[list[ModelStep]]:
    """The steps cut into maximal runs where each step continues the one before."""
    runs: list[list[ModelStep]] = []
    for step in steps:
        if runs and continues(runs[-1][-1], step):
            runs[-1].append(step)
        else:
            runs.append([step])
    return runs


def continues(previous: ModelStep, step: ModelStep) -> bool:
    """Whether ``step``'s context is ``previous``'s context and output plus more tokens."""
    if previous.kind == "compaction" or step.kind == "compaction":
        return False
    used = len(previous.prompt_ids)
    end = used + len(previous.output_ids)
    # Two slice comparisons rather than building p + o: contexts run to 100k tokens.
    return (len(step.prompt_ids) >= end
            and step.prompt_ids[:used] == previous.prompt_ids
            and step.prompt_ids[used:end] == previous.output_ids)


def trainable_tokens(samples: Sequence[Sample]) -> int:
    """The number of tokens the samples put loss on (mask 1)."""
    return sum(sum(sample.response_mask) for sample in samples)


class SampleStats(msgspec.Struct, frozen=True):
    """What cutting a rollout cost: ``sequence_tokens`` (prompt + response over all
    samples) is the forward-pass work; ``forward_passes_saved`` is against one sample per
    step."""

    steps: int
    samples: int
    trained_tokens: int
    sequence_tokens: int

    @property
    def forward_passes_saved(self) -> int:
        return self.steps - self.samples


def sample_stats(steps: Sequence[ModelStep], samples: Sequence[Sample]) -> SampleStats:
    return SampleStats(
        steps=len(steps), samples=len(samples), trained_tokens=trainable_tokens(samples),
        sequence_tokens=sum(len(s.prompt_ids) + len(s.response_ids) for s in samples))


# --- building samples ----------------------------------------------------------------------


def _step_sample(rollout_id: str, step: ModelStep) -> Sample:
    return Sample(
        rollout_id=rollout_id, steps=[step.index], prompt_ids=list(step.prompt_ids),
        response_ids=list(step.output_ids), response_mask=[1] * len(step.output_ids),
        response_logprobs=None if step.logprobs is None else list(step.logprobs),
        weight=0.0)


def _segment_sample(rollout_id: str, run: Sequence[ModelStep]) -> Sample:
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for step, following in zip(run, [*run[1:], None], strict=True):
        response += step.output_ids
        mask += [1] * len(step.output_ids)
        logprobs += step.logprobs or []
        if following is None:
            continue
        gap = following.prompt_ids[len(step.prompt_ids) + len(step.output_ids):]
        response += gap
        mask += [0] * len(gap)
        logprobs += [0.0] * len(gap)
    # Part of a sample's logprobs would misalign the rest: all of them or none.
    known = all(step.logprobs is not None for step in run)
    return Sample(
        rollout_id=rollout_id, steps=[step.index for step in run],
        prompt_ids=list(run[0].prompt_ids), response_ids=response, response_mask=mask,
        response_logprobs=logprobs if known else None, weight=0.0)


def _weighted(samples: list[Sample]) -> list[Sample]:
    # Every step has output (checked), so the rollout always has trainable tokens.
    weight = 1.0 / trainable_tokens(samples)
    return [msgspec.structs.replace(sample, weight=weight) for sample in samples]


# --- refusing malformed rollouts -----------------------------------------------------------


def _check_rollout(steps: Sequence[ModelStep], format_failure: bool) -> None:
    if not steps:
        raise RewardError("a rollout without model steps has no training samples")
    for position, step in enumerate(steps):
        _check_step(step)
        if position and step.index <= steps[position - 1].index:
            raise RewardError(f"step {step.index} follows step {steps[position - 1].index}: "
                              "step indices must increase")
        if step.format_error and position != len(steps) - 1:
            raise RewardError(f"step {step.index} broke the format but the rollout went on "
                              f"to step {steps[position + 1].index}; a format error stops it")
    last = steps[-1]
    if last.format_error and not format_failure:
        raise RewardError(f"step {last.index} broke the format but the rollout is not "
                          "treated as a format failure (format_failure=False)")


def _check_step(step: ModelStep) -> None:
    if step.kind not in _KINDS:
        raise RewardError(f"step {step.index} has kind {step.kind!r}, not one of {_KINDS}")
    if not step.prompt_ids:
        raise RewardError(f"step {step.index} has an empty context (no prompt tokens)")
    if not step.output_ids:
        raise RewardError(f"step {step.index} generated no tokens: nothing to train on")
    if step.logprobs is not None and len(step.logprobs) != len(step.output_ids):
        raise RewardError(f"step {step.index} has {len(step.logprobs)} logprobs for "
                          f"{len(step.output_ids)} generated tokens")


__all__ = [
    "SampleStats",
    "continues",
    "history_samples",
    "sample_stats",
    "segment_samples",
    "segments",
    "trainable_tokens",
]
