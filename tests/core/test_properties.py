"""Property tests (hypothesis): clipping never increases a norm past the threshold, unclipped tensors are
bit-identical, global clipping keeps directions, and everything agrees with the float64 reference."""

import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gradtool import clip_by_average_norm, clip_by_global_norm, clip_by_norm, clip_by_value, global_norm, tensor_norm
from tests.reference import RTOL, ref_clip_by_norm, ref_global, ref_l2

DTYPES = st.sampled_from([np.float16, np.float32, np.float64])
FINITE = {"allow_nan": False, "allow_infinity": False}


@st.composite
def tensors(draw, dtype=None, max_dims=3):
    dt = draw(DTYPES) if dtype is None else dtype
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=6))
    bound = {np.float16: 65504.0, np.float32: float(np.float32(1e30)), np.float64: 1e150}[dt]
    return draw(hnp.arrays(dt, shape, elements=st.floats(-bound, bound, width=np.dtype(dt).itemsize * 8, **FINITE)))


thresholds = st.floats(1e-3, 1e4)


@settings(max_examples=200, deadline=None)
@given(tensors(), thresholds)
def test_clip_by_norm_never_exceeds_threshold(t, c):
    out = clip_by_norm(t, c)
    rtol = RTOL[t.dtype.name]
    assert tensor_norm(out) <= c * (1 + 4 * rtol) or out is t
    if ref_l2(t) <= c:
        assert out is t
    else:
        np.testing.assert_allclose(out.astype(np.float64), ref_clip_by_norm(t, c), rtol=4 * rtol,
                                   atol=float(np.finfo(t.dtype).smallest_subnormal) * 4)


@settings(max_examples=100, deadline=None)
@given(tensors(max_dims=3), thresholds, st.data())
def test_clip_by_norm_axes_slices(t, c, data):
    assume(t.ndim >= 1)
    axes = data.draw(st.lists(st.integers(-t.ndim, t.ndim - 1), min_size=1, max_size=t.ndim, unique_by=lambda a: a % t.ndim))
    out = clip_by_norm(t, c, axes=axes)
    ref = ref_clip_by_norm(t, c, axes=tuple(a % t.ndim for a in axes))
    rtol = RTOL[t.dtype.name]
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=4 * rtol,
                               atol=float(np.finfo(t.dtype).smallest_subnormal) * 4)


@settings(max_examples=150, deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=4), thresholds)
def test_global_clipping_keeps_direction_and_bound(ts, c):
    out, n = clip_by_global_norm(ts, c)
    ref_n = ref_global(ts)
    assert math.isclose(n, ref_n, rel_tol=1e-12, abs_tol=0)
    if n <= c:
        assert all(o is t for o, t in zip(out, ts))
        return
    scale = c / n
    for o, t in zip(out, ts):
        rtol = RTOL[t.dtype.name]
        np.testing.assert_allclose(o.astype(np.float64), t.astype(np.float64) * scale, rtol=rtol,
                                   atol=float(np.finfo(t.dtype).smallest_subnormal) * 2)
    assert global_norm(out) <= c * (1 + 4 * max(RTOL[t.dtype.name] for t in ts))


@settings(max_examples=100, deadline=None)
@given(tensors(), st.floats(-10, 10), st.floats(0, 10))
def test_clip_by_value_bounds_and_identity(t, lo, width):
    hi = lo + width
    out = clip_by_value(t, lo, hi)
    lo_t, hi_t = np.asarray(lo, t.dtype), np.asarray(hi, t.dtype)
    assert np.all(out >= lo_t) and np.all(out <= hi_t)
    inside = (t >= lo_t) & (t <= hi_t)
    assert np.array_equal(out[inside].view(np.uint8 if t.dtype.itemsize == 1 else f"u{t.dtype.itemsize}"),
                          t[inside].view(f"u{t.dtype.itemsize}"))


@settings(max_examples=200, deadline=None)
@given(tensors(), st.floats(allow_nan=True), st.floats(allow_nan=True),
       st.sampled_from(["error", "propagate", "zero"]))
def test_clip_by_value_of_float_bounds_is_that_of_array_bounds(t, lo, hi, policy):
    """Bounds given as Python floats (checked as floats, the fast path) clip as the same bounds given as
    NumPy scalars and 0-d arrays (checked as arrays): the same bits, or the same error (NaN bounds,
    lo > hi, non-finite elements under "error")."""
    def outcome(a, b):
        try:
            with np.errstate(over="ignore"):  # (bounds past float16's range: both paths cast them)
                return clip_by_value(t, a, b, nonfinite=policy)
        except Exception as exc:  # noqa: BLE001 - the error itself is compared
            return type(exc), str(exc)

    fast = outcome(lo, hi)
    for slow in (outcome(np.float64(lo), np.float64(hi)), outcome(np.asarray(lo), np.asarray(hi))):
        if isinstance(fast, tuple):
            assert fast == slow
        else:
            assert fast.dtype == slow.dtype and fast.tobytes() == slow.tobytes()


@settings(max_examples=100, deadline=None)
@given(tensors(dtype=np.float64), thresholds, st.floats(1e-3, 1e3))
def test_scale_invariance(t, c, k):
    # clip(k·t, k·c) = k·clip(t, c)
    np.testing.assert_allclose(clip_by_norm(t * k, c * k), clip_by_norm(t, c) * k, rtol=1e-9, atol=1e-300)


@settings(max_examples=100, deadline=None)
@given(tensors(), thresholds)
def test_average_norm_is_norm_times_size(t, c):
    assume(t.size > 0)
    a = clip_by_average_norm(t, c)
    b = clip_by_norm(t, c * t.size)
    assert (a is t) == (b is t)
    assert np.array_equal(a, b, equal_nan=True)
