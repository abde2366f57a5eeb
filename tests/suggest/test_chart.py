"""The suggest report's ASCII chart: its NumPy bucketing against the plain per-value definition."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool.cli.suggest import ascii_chart


def reference_chart(values, threshold, height=8, width=72):
    """The chart by its definition, one value at a time: column c shows the peak of its bucket of values,
    '!' when the bucket holds NaN or ±inf; rows on a log scale between the smallest finite positive value
    and the largest (or the threshold), the threshold drawn as a line that points never sit on."""
    if not values:
        return []
    n = len(values)
    cols = min(width, n)
    buckets = [values[int(i * n / cols): max(int((i + 1) * n / cols), int(i * n / cols) + 1)] for i in range(cols)]
    peaks = [math.nan if any(not math.isfinite(v) for v in b) else max(b) for b in buckets]
    finite = [v for v in values if math.isfinite(v) and v > 0]
    if not finite:
        return ["(no finite positive values to chart)"]
    lo, hi = math.log10(min(finite)), math.log10(max(finite + ([threshold] if threshold else [])))
    if hi - lo < 1e-9:
        hi = lo + 1

    def row_of(v):
        return min(height - 1, max(0, int((math.log10(v) - lo) / (hi - lo) * (height - 1) + 0.5)))

    grid = [[" "] * cols for _ in range(height)]
    t_row = row_of(threshold) if threshold else None
    if t_row is not None:
        for c in range(cols):
            grid[t_row][c] = "─"
    for c, v in enumerate(peaks):
        if not math.isfinite(v):
            grid[height - 1][c] = "!"
        elif v > 0:
            r = row_of(v)
            if t_row is not None:
                r = max(r, t_row + 1) if v > threshold else min(r, t_row - 1)
                r = min(max(r, 0), height - 1)
            grid[r][c] = "•"
    labels = {height - 1: f"{10 ** hi:.3g}", 0: f"{10 ** lo:.3g}"}
    if t_row is not None:
        labels[t_row] = f"τ {threshold:.3g}"
    return [f"{labels.get(r, ''):>10} ┤" + "".join(grid[r]) for r in range(height - 1, -1, -1)]


values = st.lists(st.one_of(st.floats(1e-6, 1e6), st.sampled_from([0.0, -1.0, math.nan, math.inf, -math.inf])),
                  max_size=400)


@settings(max_examples=300, deadline=None)
@given(values, st.one_of(st.none(), st.floats(1e-3, 1e3)), st.integers(1, 80))
def test_chart_equals_its_definition(vals, threshold, width):
    assert ascii_chart(vals, threshold, width=width) == reference_chart(vals, threshold, width=width)


def test_chart_marks_a_nan_bucket_and_draws_the_threshold():
    lines = ascii_chart([1.0, 2.0, math.nan, 4.0] * 50, 3.0, width=4)
    assert any("τ 3" in line for line in lines) and "!" in lines[0]  # the top row
