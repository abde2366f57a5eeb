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


SAMPLE_RUN = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "sample_data" / "run.h5")


def test_the_report_chart_fits_a_narrow_terminal(run, monkeypatch):
    """On 80 (and 50) columns each chart row stays one line (72 columns of points after the label made
    84, which rich folded in two); piped (200 columns), the chart keeps its 72 columns."""
    import io

    from rich.console import Console

    from gradtool.cli import render

    for width, points in ((80, 68), (50, 38), (200, 72)):
        buf = io.StringIO()
        monkeypatch.setattr(render, "console", lambda stderr=False, w=width, b=buf: Console(
            file=b, markup=False, highlight=False, emoji=False, width=w, soft_wrap=False, color_system=None))
        assert run("suggest-threshold", SAMPLE_RUN).exit_code == 0
        lines = buf.getvalue().splitlines()
        first = next(i for i, line in enumerate(lines) if "┤" in line)
        rows = lines[first: first + 8]
        assert all("┤" in r and len(r) == points + 12 for r in rows)  # no row folded onto a second line
        assert "┤" not in lines[first + 8]
