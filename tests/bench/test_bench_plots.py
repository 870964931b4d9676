"""The report's time buckets: a pure choice from the run's length, always a readable count."""

from __future__ import annotations

import pytest

from txbroker.bench.trace.plots import (
    BUCKET_STEPS,
    MAX_BUCKETS,
    MIN_BUCKETS,
    bucket_count,
    bucket_seconds,
    fmt_seconds,
)


def test_short_runs_get_sub_second_buckets_long_runs_coarser_ones():
    assert bucket_seconds(3.0) == 0.1      # a 2,000-transaction run: 31 buckets, not 3
    assert bucket_seconds(0.9) == 0.02
    assert bucket_seconds(1.0) == 0.05     # 51 buckets of 0.02 s would be one too many
    assert bucket_seconds(60.0) == 2.0
    assert bucket_seconds(600.0) == 15.0
    assert bucket_seconds(3600.0) == 120.0
    assert bucket_seconds(86_400.0) == 1800.0
    assert bucket_seconds(30 * 86_400.0) % 3600 == 0


def test_the_bucket_count_stays_within_the_target_for_any_span():
    span = 0.02
    while span < 1e7:
        step = bucket_seconds(span)
        assert step in BUCKET_STEPS or step % 3600 == 0, span
        assert MIN_BUCKETS <= bucket_count(span, step) <= MAX_BUCKETS, (span, step)
        span *= 1.07


def test_widths_grow_with_the_span():
    spans = [0.01 * 1.3 ** k for k in range(60)]
    steps = [bucket_seconds(s) for s in spans]
    assert steps == sorted(steps)


def test_degenerate_spans():
    assert bucket_seconds(0.0) == BUCKET_STEPS[0]
    assert bucket_count(0.0, bucket_seconds(0.0)) == 1
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="span"):
            bucket_seconds(bad)


def test_widths_read_as_a_person_says_them():
    assert [fmt_seconds(s) for s in (0.1, 5.0, 15.0, 120.0, 7200.0)] == \
        ["0.1 s", "5 s", "15 s", "2 min", "2 h"]
