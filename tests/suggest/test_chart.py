"""The suggest report's ASCII chart: its NumPy bucketing against the plain per-value definition."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool.cli.suggest import ascii_chart, chart_columns


def reference_columns(values, threshold, width):
    """By definition, one value at a time: column c shows the peak of its bucket of values (NaN when the
    bucket holds NaN or ±inf); the log10 range runs from the smallest finite positive value to the
    largest, or to the threshold when that is higher."""
    n = len(values)
    cols = min(width, n)
    buckets = [values[int(i * n / cols): max(int((i + 1) * n / cols), int(i * n / cols) + 1)] for i in range(cols)]
    peaks = [math.nan if any(not math.isfinite(v) for v in b) else max(b) for b in buckets]
    finite = [v for v in values if math.isfinite(v) and v > 0]
    if not finite:
        return None
    lo, hi = math.log10(min(finite)), math.log10(max(finite + ([threshold] if threshold else [])))
    return peaks, lo, (lo + 1 if hi - lo < 1e-9 else hi)


values = st.lists(st.one_of(st.floats(1e-6, 1e6), st.sampled_from([0.0, -1.0, math.nan, math.inf, -math.inf])),
                  min_size=1, max_size=400)


@settings(max_examples=300, deadline=None)
@given(values, st.one_of(st.none(), st.floats(1e-3, 1e3)), st.integers(1, 80))
def test_chart_columns_equal_their_definition(vals, threshold, width):
    assert repr(chart_columns(vals, threshold, width)) == repr(reference_columns(vals, threshold, width))


def test_chart_marks_a_nan_bucket_and_draws_the_threshold():
    lines = ascii_chart([1.0, 2.0, math.nan, 4.0] * 50, 3.0, width=4)
    assert len(lines) == 8 and any("τ 3" in line for line in lines)
    assert "!" in lines[0]  # the top row
    assert ascii_chart([], 1.0) == [] and ascii_chart([0.0, math.nan], 1.0) == ["(no finite positive values to chart)"]
