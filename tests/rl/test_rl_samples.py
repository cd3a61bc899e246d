"""Training samples from a rollout's model steps (rl/samples.py): AWM's one sample per step,
WildAWM's one sample per segment, the token-mean weights and the format-failure rule,
checked on hand-computed token lists, the paper's 9-step example and random rollouts."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.errors import RewardError
from rl.contract import ModelStep, Sample
from rl.samples import (
    continues,
    history_samples,
    sample_stats,
    segment_samples,
    segments,
    trainable_tokens,
)


def lp(tokens: Sequence[int]) -> list[float]:
    """A recognisable logprob per token, so misaligned logprobs show in a failure."""
    return [-t / 100 for t in tokens]


def step(index: int, prompt: list[int], output: list[int], kind: str = "action", *,
         logprobs: bool = True, format_error: bool = False) -> ModelStep:
    return ModelStep(index=index, kind=kind, prompt_ids=prompt,  # type: ignore[arg-type]
                     output_ids=output, logprobs=lp(output) if logprobs else None,
                     format_error=format_error)


def weight_sum(samples: Sequence[Sample]) -> float:
    return sum(s.weight * sum(s.response_mask) for s in samples)


def trained(samples: Sequence[Sample]) -> list[int]:
    return [t for s in samples for t, m in zip(s.response_ids, s.response_mask, strict=True)
            if m]


# --- segments on hand-computed token lists ---------------------------------------------------

A = step(0, [1, 2], [3, 4])
# (case, steps, expected segment samples as (steps, prompt, response, mask))
SEGMENT_CASES: list[tuple[str, list[ModelStep], list[tuple[list[int], list[int], list[int],
                                                          list[int]]]]] = [
    ("one step", [A], [([0], [1, 2], [3, 4], [1, 1])]),
    ("continuation with a tool result between",
     [A, step(1, [1, 2, 3, 4, 5, 6], [7])],
     [([0, 1], [1, 2], [3, 4, 5, 6, 7], [1, 1, 0, 0, 1])]),
    ("continuation with nothing between", [A, step(1, [1, 2, 3, 4], [7])],
     [([0, 1], [1, 2], [3, 4, 7], [1, 1, 1])]),
    ("truncated history breaks the context", [A, step(1, [9, 3, 4, 5], [7])],
     [([0], [1, 2], [3, 4], [1, 1]), ([1], [9, 3, 4, 5], [7], [1])]),
    ("a context shorter than the last one's breaks it", [A, step(1, [1, 2, 3], [7])],
     [([0], [1, 2], [3, 4], [1, 1]), ([1], [1, 2, 3], [7], [1])]),
    ("an edited output breaks it", [A, step(1, [1, 2, 3, 5, 6], [7])],
     [([0], [1, 2], [3, 4], [1, 1]), ([1], [1, 2, 3, 5, 6], [7], [1])]),
    ("a compaction call is its own run even when it extends the context",
     [A, step(1, [1, 2, 3, 4, 8], [20, 21], "compaction"), step(2, [1, 2, 3, 4, 8, 20, 21], [5])],
     [([0], [1, 2], [3, 4], [1, 1]), ([1], [1, 2, 3, 4, 8], [20, 21], [1, 1]),
      ([2], [1, 2, 3, 4, 8, 20, 21], [5], [1])]),
    ("three steps, two gaps",
     [A, step(1, [1, 2, 3, 4, 5], [6]), step(2, [1, 2, 3, 4, 5, 6, 7, 8], [9])],
     [([0, 1, 2], [1, 2], [3, 4, 5, 6, 7, 8, 9], [1, 1, 0, 1, 0, 0, 1])]),
]


@pytest.mark.parametrize(("steps", "expected"), [c[1:] for c in SEGMENT_CASES],
                         ids=[c[0] for c in SEGMENT_CASES])
def test_segment_samples(steps: list[ModelStep],
                         expected: list[tuple[list[int], list[int], list[int], list[int]]]
                         ) -> None:
    samples = segment_samples("r", steps)
    got = [(s.steps, s.prompt_ids, s.response_ids, s.response_mask) for s in samples]
    assert got == expected
    total = sum(len(s.output_ids) for s in steps)
    assert all(s.weight == 1 / total and s.rollout_id == "r" for s in samples)


def test_segment_logprobs_are_the_steps_with_zero_on_the_gaps() -> None:
    [sample] = segment_samples("r", [A, step(1, [1, 2, 3, 4, 5, 6], [7])])
    assert sample.response_logprobs == [-0.03, -0.04, 0.0, 0.0, -0.07]


def test_a_step_without_logprobs_leaves_only_its_sample_without() -> None:
    steps = [A, step(1, [1, 2, 3, 4], [7], logprobs=False), step(2, [9], [8])]
    first, second = segment_samples("r", steps)
    assert first.response_logprobs is None
    assert second.response_logprobs == [-0.08]
    assert [s.response_logprobs for s in history_samples("r", steps)] == \
        [[-0.03, -0.04], None, [-0.08]]


def test_history_samples_train_each_turn_on_its_own_context() -> None:
    steps = [A, step(1, [1, 2, 3, 4, 5, 6], [7]), step(2, [9, 7], [8, 8])]
    samples = history_samples("r", steps)
    assert [(s.steps, s.prompt_ids, s.response_ids, s.response_mask, s.response_logprobs)
            for s in samples] == [
        ([0], [1, 2], [3, 4], [1, 1], [-0.03, -0.04]),
        ([1], [1, 2, 3, 4, 5, 6], [7], [1], [-0.07]),
        ([2], [9, 7], [8, 8], [1, 1], [-0.08, -0.08]),
    ]
    assert all(s.weight == 1 / 5 for s in samples)


# --- the paper's example ---------------------------------------------------------------------


def papers_rollout() -> list[ModelStep]:
    """9 steps, a compaction at step 5: steps 1-4 share a context, step 5 summarises it,
    steps 6-9 start from the compacted context."""
    steps: list[ModelStep] = []
    prompt = [100, 101]
    for index in range(1, 5):
        steps.append(step(index, prompt, [index, index]))
        prompt = [*prompt, index, index, 200 + index]  # the tool result follows the call
    steps.append(step(5, [300, *prompt], [50, 51, 52], "compaction"))
    prompt = [100, 101, 50, 51, 52]
    for index in range(6, 10):
        steps.append(step(index, prompt, [index]))
        prompt = [*prompt, index, 200 + index]
    return steps


def test_the_papers_example_gives_three_segments_instead_of_nine_steps() -> None:
    steps = papers_rollout()
    by_segment = segment_samples("r", steps)
    assert [s.steps for s in by_segment] == [[1, 2, 3, 4], [5], [6, 7, 8, 9]]
    assert len(history_samples("r", steps)) == 9
    stats = sample_stats(steps, by_segment)
    assert (stats.steps, stats.samples, stats.forward_passes_saved) == (9, 3, 6)
    assert stats.trained_tokens == 8 + 3 + 4 == trainable_tokens(by_segment)
    first = by_segment[0]
    assert first.response_ids == [1, 1, 201, 2, 2, 202, 3, 3, 203, 4, 4]
    assert first.response_mask == [1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1]
    # One forward pass per segment costs fewer tokens than one per step.
    per_step = sample_stats(steps, history_samples("r", steps))
    assert stats.sequence_tokens < per_step.sequence_tokens


def test_a_rollout_weighs_one_whichever_way_it_is_cut() -> None:
    steps = papers_rollout()
    for samples in (segment_samples("r", steps), history_samples("r", steps)):
        assert weight_sum(samples) == pytest.approx(1.0, rel=1e-12)
        assert len({s.weight for s in samples}) == 1


# --- format failures ------------------------------------------------------------------------


@pytest.mark.parametrize("marked", [True, False], ids=["marked", "unmarked: the last step"])
@pytest.mark.parametrize("split", [history_samples, segment_samples])
def test_a_format_failure_trains_only_the_offending_step(split: Any, marked: bool) -> None:
    steps = [A, step(1, [1, 2, 3, 4, 5], [6, 6, 6], format_error=marked)]
    [sample] = split("r", steps, format_failure=True)
    assert (sample.steps, sample.prompt_ids, sample.response_ids, sample.response_mask) == \
        ([1], [1, 2, 3, 4, 5], [6, 6, 6], [1, 1, 1])
    assert sample.weight == 1 / 3


# --- refusals --------------------------------------------------------------------------------

REFUSALS: list[tuple[str, list[ModelStep], bool, str]] = [
    ("no steps", [], False, "without model steps"),
    ("logprobs of another length",
     [A, ModelStep(index=3, kind="action", prompt_ids=[1], output_ids=[2, 3], logprobs=[-1.0])],
     False, "step 3 has 1 logprobs for 2"),
    ("no output", [step(0, [1], [7]), step(4, [1], [])], False, "step 4 generated no tokens"),
    ("no context", [step(2, [], [7])], False, "step 2 has an empty context"),
    ("indices out of order", [step(2, [1], [7]), step(1, [1], [7])], False,
     "step 1 follows step 2"),
    ("a format error in the middle", [step(0, [1], [7], format_error=True), step(1, [1], [7])],
     True, "step 0 broke the format but the rollout went on to step 1"),
    ("a format error not flagged", [step(0, [1], [7]), step(1, [1], [7], format_error=True)],
     False, "step 1 broke the format"),
    ("an unknown kind", [step(0, [1], [7], "summary")], False, "step 0 has kind 'summary'"),
]


@pytest.mark.parametrize(("steps", "failure", "message"), [c[1:] for c in REFUSALS],
                         ids=[c[0] for c in REFUSALS])
@pytest.mark.parametrize("split", [history_samples, segment_samples])
def test_a_malformed_rollout_is_refused(split: Any, steps: list[ModelStep], failure: bool,
                                        message: str) -> None:
    with pytest.raises(RewardError, match=message):
        split("r", steps, format_failure=failure)


# --- random rollouts -------------------------------------------------------------------------

tokens = st.lists(st.integers(0, 999), max_size=4)


@st.composite
def rollouts(draw: st.DrawFn) -> tuple[list[ModelStep], int]:
    """Steps that either continue the last one's context or start a fresh one (a marker
    token never used before, so it cannot continue by accident), with random compactions;
    and the number of context breaks built in."""
    fresh = itertools.count(10_000)
    steps: list[ModelStep] = []
    breaks = 0
    for index in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["action", "action", "compaction"]))
        previous = steps[-1] if steps else None
        extend = previous is not None and draw(st.booleans())
        if previous is not None and extend:
            prompt = [*previous.prompt_ids, *previous.output_ids, *draw(tokens)]
        else:
            prompt = [next(fresh), *draw(tokens)]
        if previous is not None and not (extend and kind == previous.kind == "action"):
            breaks += 1
        output = draw(st.lists(st.integers(0, 999), min_size=1, max_size=5))
        steps.append(step(index, prompt, output, kind, logprobs=draw(st.booleans())))
    return steps, breaks


@given(rollouts())
def test_random_rollouts(rollout: tuple[list[ModelStep], int]) -> None:
    steps, breaks = rollout
    by_segment = segment_samples("r", steps)
    by_step = history_samples("r", steps)
    assert len(by_segment) == breaks + 1 == len(segments(steps))
    assert len(by_step) == len(steps)
    outputs = [t for s in steps for t in s.output_ids]
    for samples in (by_segment, by_step):
        assert trained(samples) == outputs
        assert weight_sum(samples) == pytest.approx(1.0, rel=1e-12)
        assert [i for s in samples for i in s.steps] == [s.index for s in steps]
    for sample, run in zip(by_segment, segments(steps), strict=True):
        # One segment's sequence is exactly what its last step saw and generated.
        assert sample.prompt_ids + sample.response_ids == run[-1].prompt_ids + run[-1].output_ids
        assert all(continues(a, b) for a, b in itertools.pairwise(run))
        if all(s.logprobs is not None for s in run):
            assert sample.response_logprobs is not None
            pairs = zip(sample.response_logprobs, sample.response_mask, strict=True)
            assert [x for x, m in pairs if m] == [x for s in run for x in s.logprobs or []]
        else:
            assert sample.response_logprobs is None
