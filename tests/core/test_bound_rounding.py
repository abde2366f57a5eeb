"""Clip bounds rounded once to a narrow tensor dtype (bfloat16, float16, float8), against an exact
reference: every value of the dtype enumerated, the nearest taken with fractions, ties to the even bit
pattern, past the largest finite value to inf as IEEE 754 says."""

import bisect
import math
import os
import subprocess
import sys
import warnings
from fractions import Fraction
from functools import cache

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool.core.clipping import bfloat16_bits_of, bound_in_dtype, clip_by_value, round_to_odd_float32

NARROW = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
          "float8_e5m2": ml_dtypes.float8_e5m2}
UINT = {1: np.uint8, 2: np.uint16}


@cache
def _values(name):
    """(the dtype's non-negative finite values in order, float64; their bit patterns; whether it has inf)."""
    dtype = np.dtype(NARROW[name])
    bits = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint32).astype(UINT[dtype.itemsize])
    with np.errstate(invalid="ignore"):
        values = bits.view(dtype).astype(np.float64)
    keep = np.isfinite(values) & ~np.signbit(values)
    order = np.argsort(values[keep], kind="stable")
    return values[keep][order].tolist(), bits[keep][order].tolist(), bool(np.isinf(values).any())


def _reference_bits(x, name):
    """The bits of float64 ``x`` rounded to nearest (ties to the even pattern) in dtype ``name``, exactly;
    None past the largest finite value of a dtype without inf."""
    values, bits, has_inf = _values(name)
    sign = (0x80 if np.dtype(NARROW[name]).itemsize == 1 else 0x8000) if math.copysign(1, x) < 0 else 0
    a = abs(x)
    top = values[-1]
    if a > top:
        gap = Fraction(top) - Fraction(values[-2])
        if not has_inf:
            return None
        inf_bits = int(np.array(np.inf, dtype=NARROW[name]).view(UINT[np.dtype(NARROW[name]).itemsize]))
        # (IEEE: past max + half its last step, or at it (a tie; inf's pattern is the even one), inf)
        return (inf_bits if Fraction(a) >= Fraction(top) + gap / 2 else bits[-1]) | sign
    i = bisect.bisect_left(values, a)
    if values[i] == a:
        return bits[i] | sign
    below, above = Fraction(values[i - 1]), Fraction(values[i])
    d_below, d_above = Fraction(a) - below, above - Fraction(a)
    if d_below != d_above:
        return (bits[i - 1] if d_below < d_above else bits[i]) | sign
    return (bits[i - 1] if bits[i - 1] % 2 == 0 else bits[i]) | sign


@st.composite
def near_midpoints(draw, name):
    """A float64 at or next to the midpoint of two neighbouring values of the dtype, off it by a few
    float64 steps or by a relative 2^-25 .. 2^-52 (where rounding through float32 first would decide
    the midpoint the other way), of either sign."""
    values, _, _ = _values(name)
    i = draw(st.integers(0, len(values) - 2))
    mid = (values[i] + values[i + 1]) / 2  # (exact: one bit more than the dtype has)
    how = draw(st.sampled_from(["ulps", "relative", "exact"]))
    if how == "ulps":
        x = mid + draw(st.integers(-3, 3)) * math.ulp(mid)
    elif how == "relative":
        x = mid * (1 + draw(st.sampled_from([-1, 1])) * 2.0 ** -draw(st.integers(25, 52)))
    else:
        x = mid
    return -x if draw(st.booleans()) else x


def _finite_in(name):
    values, _, has_inf = _values(name)
    top = 1e300 if has_inf else values[-1]
    return st.floats(-top, top, allow_nan=False, allow_subnormal=True)


def _bits_of(a, name):
    return int(np.asarray(a).reshape(()).view(UINT[np.dtype(NARROW[name]).itemsize]))


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from(sorted(NARROW)))
def test_bounds_round_once_to_the_nearest_value(data, name):
    """bound_in_dtype (clip_by_value's rounding of its bounds) gives the exact reference's bits for
    values anywhere in the dtype's range and next to its midpoints (subnormals, both zeros, past bfloat16's
    and float16's largest value to inf), for every ml_dtypes release; bfloat16_bits_of (the compiled
    kernel's bounds) the same for bfloat16."""
    x = data.draw(st.one_of(_finite_in(name), near_midpoints(name)))
    want = _reference_bits(x, name)
    got = bound_in_dtype(np.asarray(x), np.dtype(NARROW[name]), np)
    assert _bits_of(got, name) == want, (x, hex(want))
    if name == "bfloat16":
        assert bfloat16_bits_of(x) == want
    if name == "float16":  # (NumPy rounds float64 to float16 once itself)
        with np.errstate(over="ignore"):
            assert _bits_of(np.float16(x), name) == want


def test_the_documented_midpoint_rounds_once():
    """1.00390625 + 2^-40 lies just above the midpoint of bfloat16's 1.0 and 1.0078125: once rounded,
    0x3f81; through float32 first (ml_dtypes before 0.7), 1.00390625 exactly, a tie, 0x3f80."""
    x = 1.00390625 + 2.0 ** -40
    assert bfloat16_bits_of(x) == 0x3F81 == _reference_bits(x, "bfloat16")
    assert bfloat16_bits_of(-x) == 0xBF81
    t = np.array([5.0, -5.0, 1.0], dtype=ml_dtypes.bfloat16)
    out = clip_by_value(t, -x, x, xp=np)
    assert out.view(np.uint16).tolist() == [0x3F81, 0xBF81, 0x3F80]


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=True))
def test_round_to_odd_brackets_x(x):
    """round_to_odd_float32(x) is x when float32 holds it; else a float32 of odd pattern and x's sign, x
    lying strictly between its two neighbours (the pair of float32 values around x: the odd one of them)."""
    r = round_to_odd_float32(np.asarray(x))
    assert r.dtype == np.float32 and r.shape == ()
    b = int(r.view(np.uint32))
    if float(r) == x:
        return
    assert b & 1 and math.copysign(1, float(r)) == math.copysign(1, x)
    below, above = (abs(float(np.array(b + d, dtype=np.uint32).view(np.float32))) for d in (-1, 1))
    assert below < abs(x) < above and abs(x) != abs(float(r))


def test_round_to_odd_keeps_the_shape_and_the_specials():
    x = np.array([[1.0, np.inf, -np.inf], [np.nan, -0.0, 1e39]])
    r = round_to_odd_float32(x)
    assert r.shape == x.shape and r.dtype == np.float32
    assert np.isinf(r[0, 1]) and np.isinf(r[0, 2]) and np.isnan(r[1, 0]) and np.signbit(r[1, 1])
    assert int(r[1:, 2:].view(np.uint32)[0, 0]) == 0x7F7FFFFF  # (past float32: its largest, odd)


def test_bounds_past_the_range_become_inf_without_a_warning():
    """A bound past float16's range is ±inf there (nothing clipped by it), with no RuntimeWarning."""
    t = np.array([-7000.0, 1.0, 7000.0, -np.inf], dtype=np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = clip_by_value(t, -1e30, 1e30, nonfinite="propagate", xp=np)
        assert out is t
        out = clip_by_value(t, -1e30, 1000.0, nonfinite="propagate", xp=np)
    assert out.tolist() == [-7000.0, 1.0, 1000.0, -np.inf]


def test_clip_value_without_the_kernel_prints_no_warning(tmp_path):
    """`clip --mode value` of float16 with a bound past its range, the kernels off: the report, and
    nothing on stderr (NumPy's "overflow encountered in cast" reached users)."""
    src = tmp_path / "f16.npz"
    np.savez(src, a=np.array([1, 2, -7000, 3], np.float16))
    env = dict(os.environ, GRADTOOL_NO_KERNELS="1")
    r = subprocess.run([sys.executable, "-m", "gradtool", "clip", "--mode", "value", "--max", "1000",
                        "--min", "-1e30", str(src), "-o", str(tmp_path / "out.npz")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert np.load(tmp_path / "out.npz")["a"].tolist() == [1, 2, -7000, 3]


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_kernel_bounds_are_clip_by_values(name, data):
    """The compiled clip_values with bounds next to a midpoint gives clip_by_value's bits on every value of
    the dtype (their rounding of the bounds agrees)."""
    from gradtool.clip_dump import _fused_clip_values
    from gradtool.core import kernels
    from gradtool.io.base import TensorInfo

    if kernels.compiled_clip_values is None:
        pytest.skip("no compiled kernel")
    hi = abs(data.draw(near_midpoints(name)))
    lo = -abs(data.draw(near_midpoints(name)))
    dtype = np.dtype(NARROW[name])
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    with np.errstate(all="ignore"):
        want = np.asarray(clip_by_value(x, lo, hi, nonfinite="propagate", xp=np))
    out = np.empty_like(x)
    _fused_clip_values(TensorInfo("t", x.shape, dtype), lo, hi)(x, out)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
