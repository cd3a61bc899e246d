"""worldstore.names: the timestamp arithmetic replay runs once per event."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from worldstore.names import TS_RE, ts_millis, ts_problem

EPOCH = datetime(1970, 1, 1)


def by_datetime(ts: str) -> int:
    """What ts_millis must equal: the moment minus the epoch, in whole milliseconds."""
    return (datetime.fromisoformat(ts[:-1]) - EPOCH) // timedelta(milliseconds=1)


@st.composite
def timestamps(draw: st.DrawFn) -> str:
    moment = draw(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)))
    digits = draw(st.integers(0, 6))
    text = f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%S")
    if digits:
        text += "." + draw(st.text("0123456789", min_size=digits, max_size=digits))
    return text + "Z"


@given(timestamps())
def test_ts_millis_equals_datetime_arithmetic(ts: str) -> None:
    assert TS_RE.fullmatch(ts) and ts_problem(ts) is None
    assert ts_millis(ts) == by_datetime(ts)


def test_ts_millis_truncates_the_fraction_to_milliseconds() -> None:
    assert ts_millis("1970-01-01T00:00:00Z") == 0
    assert ts_millis("1970-01-01T00:00:01.9999Z") == 1999
    assert ts_millis("1970-01-01T00:01:00.5Z") == 60_500
    assert ts_millis("1969-12-31T23:59:59.001Z") == -999


def test_more_minutes_than_the_minute_cache_holds_stay_exact() -> None:
    start = datetime(2026, 1, 1, 0, 0, 7)
    for minute in [*range(10_000), *range(10)]:  # past the cache's size, then again
        ts = (start + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.25Z")
        assert ts_millis(ts) == by_datetime(ts)
