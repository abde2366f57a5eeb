"""The fast paths give the answers of the simple ones (hypothesis, across chunk and row boundaries)."""

import contextlib
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import global_norm, tensor_norm, tensor_stats
from gradtool.core import kernels
from gradtool.core.norms import ROW, NormAccumulator, combine_norms
from gradtool.core.stats import StatsAccumulator
from tests.reference import ref_l2, ref_mean_std

sizes = st.sampled_from([0, 1, 7, ROW - 1, ROW, ROW + 1, 3 * ROW + 17])
dtypes = st.sampled_from([np.float16, np.float32, np.float64])
scales = st.sampled_from([1e-30, 1e-20, 1e-3, 1.0, 1e3, 1e19, 1e30])


@st.composite
def arrays(draw):
    n = draw(sizes)
    dt = draw(dtypes)
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(scales)
    with np.errstate(over="ignore", under="ignore"):
        a = (np.random.default_rng(seed).standard_normal(n) * scale).astype(dt)
    if n and draw(st.booleans()):
        a[draw(st.integers(0, n - 1))] = draw(st.sampled_from([0.0, np.nan, np.inf, -np.inf]))
    return a


@settings(max_examples=80, deadline=None)
@given(arrays(), st.integers(1, 40_000))
def test_streamed_chunks_equal_whole_tensor(a, chunk):
    whole = tensor_stats(a)
    acc = StatsAccumulator()
    nacc = NormAccumulator(2)
    for i in range(0, a.size, chunk):
        acc.update(a[i:i + chunk])
        nacc.update(a[i:i + chunk])
    s = acc.result(a.shape, a.dtype.name, True)
    assert (s.nan_count, s.inf_count, s.zero_count) == (whole.nan_count, whole.inf_count, whole.zero_count)
    ref = ref_l2(a)
    for got in (s.norm, whole.norm, nacc.result(), tensor_norm(a)):
        if math.isnan(ref):
            assert math.isnan(got)
        elif math.isinf(ref):
            assert got == math.inf
        else:
            assert math.isclose(got, ref, rel_tol=3e-7, abs_tol=0), (got, ref)


@settings(max_examples=40, deadline=None)
@given(st.lists(arrays(), min_size=0, max_size=30))
def test_global_norm_fast_path_equals_per_tensor_path(ts):
    fast = global_norm(ts)
    slow = combine_norms(tensor_norm(t) for t in ts)
    if math.isnan(slow):
        assert math.isnan(fast)
    else:
        assert fast == slow or math.isclose(fast, slow, rel_tol=3e-7)


FLOAT64_SCALES = [0.0, 1e-320, 1e-300, 1e-160, 1e-120, 1e-50, 1.0, 1e50, 1e120, 1e160, 1e300, 1e307]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(FLOAT64_SCALES), st.integers(0, 3 * ROW),
                          st.integers(0, 2**32 - 1)), min_size=1, max_size=4),
       st.integers(1, 5 * ROW), st.integers(0, 12 * ROW), st.booleans())
def test_float64_mean_and_std_over_the_whole_range(segments, chunk, split, nonfinite):
    """float64 runs at any scale from subnormal to near float64's limit, streamed in chunks and merged
    from two halves: mean and std equal the exact reference to rounding (relative to the largest |x| for
    values that cancel), never NaN or inf for finite data."""
    with np.errstate(over="ignore", under="ignore"):
        a = np.concatenate([np.random.default_rng(seed).standard_normal(n) * scale
                            for scale, n, seed in segments])
    if nonfinite and a.size:
        a[a.size // 2] = np.nan
        a[-1] = -np.inf
    mean, std = ref_mean_std(a)
    finite = a[np.isfinite(a)]
    amax = float(np.abs(finite).max()) if finite.size else 0.0
    split = min(split, a.size)
    halves = [StatsAccumulator(), StatsAccumulator()]
    for acc, part in zip(halves, (a[:split], a[split:]), strict=True):
        for i in range(0, part.size, chunk):
            acc.update(part[i:i + chunk])
    halves[0].merge(halves[1])
    for s in (halves[0].result(a.shape, "float64", True), tensor_stats(a)):
        if mean is None:
            assert s.mean is None and s.std is None
            continue
        assert abs(s.mean - mean) <= 1e-12 * amax + 1e-323, (s.mean, mean)
        assert abs(s.std - std) <= 1e-9 * std + 1e-12 * amax + 1e-323, (s.std, std)


def _float64_parts_as_before(c, compiled=False):
    """NormAccumulator's float64 chunk as it was taken before its fast path: a float64 copy, |c|, its max,
    and NumPy's sum of c·c (of c/m, scaled, outside 1e-150..1e150); ``compiled``: the sum of c·c the
    compiled ``f64_summary``'s (in the unscaled range)."""
    a = np.abs(c.astype(np.float64))
    m = float(np.max(a))
    if math.isnan(m) or math.isinf(m) or not m > 0:
        return m, []
    if 1e-150 < m < 1e150:
        return m, [(1.0, kernels.compiled_f64_summary(c)[1] if compiled else float(np.sum(c * c)))]
    scaled = c / m
    return m, [(m, float(np.sum(scaled * scaled)))]


@settings(max_examples=300, deadline=None)
@given(n=st.sampled_from([1, 5, 4095, 4096, 100_003, 1 << 18]),
       scale=st.sampled_from([1e-310, 1e-200, 1e-151, 1e-30, 1.0, 1e30, 1e149, 1e151, 1e300]),
       special=st.sampled_from([None, 0.0, -0.0, np.nan, np.inf, -np.inf, 5e-324, 1.7e308]),
       zeros=st.booleans(), seed=st.integers(0, 2**32 - 1), compiled=st.booleans())
def test_float64_chunks_have_the_bits_of_the_copying_path(n, scale, special, zeros, seed, compiled):
    """NormAccumulator takes a float64 chunk's max |x| from its max and min and its Σx² over c·c in a
    reused buffer, or both from the compiled ``f64_summary``: the same parts, extremes and flags as the
    copies it made before, Σx² the kernel's where it is used (subnormals, the scaled range's edges, ±0,
    NaN, ±inf, all zeros; a chunk after a longer one reuses its buffer)."""
    if compiled and kernels.compiled_f64_summary is None:
        compiled = False  # (the NumPy path, as without the kernel)
    with contextlib.nullcontext() if compiled else kernels.disabled():
        _check_float64_chunk(n, scale, special, zeros, seed, compiled)


def _check_float64_chunk(n, scale, special, zeros, seed, compiled):
    rng = np.random.default_rng(seed)
    c = np.zeros(n) if zeros else rng.standard_normal(n) * scale
    if special is not None:
        c[rng.integers(0, n)] = special
    acc = NormAccumulator(2)
    acc.update(rng.standard_normal(2 * n + 1))  # a longer chunk first: the buffer is reused, not fresh
    before, amax = list(acc.parts), acc.amax
    acc.update(c)
    m, parts = _float64_parts_as_before(c, compiled)
    assert (acc.nan, acc.inf) == (math.isnan(m), math.isinf(m))
    if math.isfinite(m):
        assert acc.parts == before + parts and acc.amax == max(amax, m)
    assert c.dtype == np.float64  # (the input is left as it was: its own max, not the buffer's)
    assert float(np.max(np.abs(c))) == m or math.isnan(m)
    alone = NormAccumulator(2)
    alone.update(c)
    expected = math.nan if math.isnan(m) else math.inf if math.isinf(m) else _result_of(parts)
    assert alone.result() == expected or (math.isnan(expected) and math.isnan(alone.result()))
    if math.isfinite(m) and m > 0:  # against an independent float64 reference
        assert math.isclose(alone.result(), ref_l2(c), rel_tol=1e-12)


def test_an_empty_float64_chunk_adds_nothing():
    acc = NormAccumulator(2)
    acc.update(np.zeros(0))
    assert (acc.parts, acc.amax, acc.nan, acc.inf, acc.result()) == ([], 0.0, False, False, 0.0)


def _result_of(parts):
    """The norm NormAccumulator.result gives for one chunk's parts taken as before."""
    acc = NormAccumulator(2)
    acc.parts = list(parts)
    return acc.result()
