import math
import warnings

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

import gradtool
from gradtool import tensor_stats
from tests.reference import ref_l2, ref_mean_std


def test_stats_against_numpy_float64(xp):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((33, 17)).astype(np.float32)
    a[0, :5] = 0
    s = tensor_stats(xp.asarray(a))
    d = a.astype(np.float64)
    assert s.shape == (33, 17) and s.size == 561 and s.dtype == "float32" and s.is_float
    assert s.norm == pytest.approx(ref_l2(a), rel=1e-12) and s.l2_norm == s.norm
    assert s.avg_norm == pytest.approx(ref_l2(a) / 561, rel=1e-12)
    assert s.max_abs == np.abs(d).max() and s.min == d.min() and s.max == d.max()
    assert s.mean == pytest.approx(d.mean(), rel=1e-12, abs=1e-15)
    assert s.std == pytest.approx(d.std(), rel=1e-12)
    assert (s.nan_count, s.inf_count, s.zero_count) == (0, 0, 5)


def test_stats_norm_type(xp):
    x = xp.asarray([-2.0, 3.0, 6.0])
    assert tensor_stats(x, 1).norm == 11.0
    assert tensor_stats(x, "inf").norm == 6.0
    assert tensor_stats(x, 1).l2_norm == 7.0


def test_stats_nonfinite_counts_and_finite_moments(xp):
    s = tensor_stats(xp.asarray([1.0, math.nan, math.inf, -math.inf, 0.0, 3.0]))
    assert (s.nan_count, s.inf_count, s.zero_count) == (1, 2, 1)
    assert math.isnan(s.norm)
    assert s.max_abs == math.inf and s.min == -math.inf and s.max == math.inf
    assert s.mean == pytest.approx(4 / 3) and s.std == pytest.approx(np.std([1.0, 0.0, 3.0]))
    assert s.nonfinite_count == 3


def test_stats_all_nan(xp):
    s = tensor_stats(xp.asarray([math.nan, math.nan]))
    assert s.nan_count == 2 and s.mean is None and s.max_abs is None and math.isnan(s.norm)


def test_stats_empty(xp):
    s = tensor_stats(xp.asarray(np.zeros((0, 2), np.float32)))
    assert s.size == 0 and s.norm == 0.0 and s.avg_norm is None and s.mean is None and s.zero_count == 0


def test_stats_integers_and_bools():
    s = tensor_stats(np.array([3, 4, 0], np.int64))
    assert not s.is_float and s.norm == 5.0 and s.zero_count == 1 and s.dtype == "int64"
    b = tensor_stats(np.array([True, False, True]))
    assert b.norm == pytest.approx(math.sqrt(2)) and b.zero_count == 1


def _ref_complex(values: list[complex]) -> dict:
    """Statistics of complex values from their moduli, element by element in Python (math.hypot); NaN
    where a part is NaN, inf where a part is ±inf and none is NaN."""
    nan = [math.isnan(z.real) or math.isnan(z.imag) for z in values]
    inf = [not n and (math.isinf(z.real) or math.isinf(z.imag)) for z, n in zip(values, nan)]
    moduli = [math.hypot(z.real, z.imag) for z, n, i in zip(values, nan, inf) if not (n or i)]
    l2 = math.nan if any(nan) else math.inf if any(inf) else ref_l2(moduli)
    return {"l2": l2, "l1": math.nan if any(nan) else math.inf if any(inf) else math.fsum(moduli),
            "amax": math.inf if any(inf) else max(moduli, default=0.0), "nan": sum(nan), "inf": sum(inf),
            "zeros": sum(z == 0 for z in values)}


@settings(max_examples=60, deadline=None)
@given(parts=hnp.arrays(np.float64, st.integers(1, 300),
                        elements=st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32),
                                           st.sampled_from([0.0, -0.0, 1e-30, 3e38]))),
       dtype=st.sampled_from([np.complex64, np.complex128]), chunk=st.integers(1, 64))
def test_stats_of_complex_tensors_are_those_of_their_moduli(parts, dtype, chunk):
    """A complex tensor's imaginary parts were dropped (NumPy's ComplexWarning on stderr): [3j, 4j] had
    norm 0 and two zeros. Now: its moduli's norms, max |z| and counts, in any chunking; no min, max,
    mean or std."""
    from gradtool.core.stats import StatsAccumulator

    z = (parts[: parts.size // 2 * 2 or 1].view(np.complex128) if parts.size > 1
         else parts.astype(np.complex128)).astype(dtype)
    values = [complex(v) for v in z.tolist()]
    ref = _ref_complex(values)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning: no part is dropped
        s = tensor_stats(z)
        acc = StatsAccumulator(1)
        for start in range(0, z.size, chunk):
            acc.update(z[start:start + chunk])
        streamed = acc.result(z.shape, "complex", False)
        amax = gradtool.tensor_norm(z, "inf")  # NumPy's hypot and math.hypot may differ by an ulp
        assert amax == pytest.approx(ref["amax"], rel=1e-15) or math.isnan(ref["l1"])
    for got in (s, streamed):
        assert not got.is_float and (got.min, got.max, got.mean, got.std) == (None,) * 4
        assert (got.nan_count, got.inf_count, got.zero_count) == (ref["nan"], ref["inf"], ref["zeros"])
        if math.isfinite(ref["l2"]):
            assert got.l2_norm == pytest.approx(ref["l2"], rel=1e-12)
        else:
            assert got.l2_norm == ref["l2"] or (math.isnan(got.l2_norm) and math.isnan(ref["l2"]))
        if not ref["nan"]:
            assert got.max_abs == pytest.approx(ref["amax"], rel=1e-15)
    l1 = streamed.norm
    assert (l1 == pytest.approx(ref["l1"], rel=1e-12) if math.isfinite(ref["l1"])
            else l1 == ref["l1"] or math.isnan(l1) and math.isnan(ref["l1"]))
    assert gradtool.tensor_norm(z) == s.norm or math.isnan(s.norm)


def test_complex_tensors_on_every_namespace(xp):
    z = xp.asarray(np.array([3j, 4 + 0j, 0j, 1 - 1j], np.complex64))
    s = tensor_stats(z)
    assert s.norm == pytest.approx(math.sqrt(27), rel=1e-12) and s.max_abs == 4.0 and s.zero_count == 1
    assert s.mean is None and s.std is None and s.min is None and not s.is_float
    assert gradtool.tensor_norm(z, 1) == pytest.approx(7 + math.sqrt(2), rel=1e-12)
    assert gradtool.global_norm([z]) == 0.0  # not floating point: not counted, as ints are not


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_stats_low_precision(dtype):
    a = np.array([300, 400, -1], dtype=dtype)
    s = tensor_stats(a)
    assert s.norm == pytest.approx(ref_l2(a.astype(np.float64)), rel=1e-12)
    assert s.dtype == np.dtype(dtype).name


EXTREME_FLOAT64 = {
    "1e155": np.array([1.0, -2.0, 3.0, 4.5]) * 1e155,  # squared deviations overflow float64
    "1e300": np.array([1.0, -2.0, 3.0, 4.5]) * 1e300,
    "max": np.array([-1.7e308, 1.7e308]),  # Σx and the deviations themselves reach float64's limit
    "1e-160": np.array([1e-160, 3e-160, -2e-160]),  # squared deviations lose digits to subnormals
    "1e-170": np.array([1e-170, 3e-170]),  # ... or underflow to 0
    "subnormal": np.array([1e-310, 3e-310, -2e-310]),
    "zeros, then tiny": np.r_[np.zeros(2 * 262144), [1e-160, 3e-160]],  # scales combined across chunks
    "huge chunk, then ordinary ones": np.r_[np.full(262144, 1e200), np.arange(300000.0)],
    "NaN and inf beside huge values": np.array([np.nan, 1e300, -np.inf, 3e300]),
}


@pytest.mark.parametrize("name", list(EXTREME_FLOAT64))
def test_mean_and_std_of_extreme_float64_values(name):
    """Mean and std over float64's whole range, against the exact reference: they were NaN (Σx
    overflowing), inf (squared deviations overflowing beyond |x| ~ 1e154) or 0 / a few digits (squared
    deviations underflowing below ~1e-154)."""
    a = EXTREME_FLOAT64[name]
    mean, std = ref_mean_std(a)
    s = tensor_stats(a)
    assert s.mean == pytest.approx(mean, rel=1e-13, abs=1e-323)
    assert s.std == pytest.approx(std, rel=1e-13, abs=1e-323)


def test_norm_beyond_float64_is_inf_not_nan():
    """A norm of finite elements past float64's range is inf (IEEE overflow), not NaN; mean and std stay
    finite, and clipping it gives TF's zeros rather than NaN."""
    from gradtool import clip_by_norm, tensor_norm

    a = np.full(10**6, 1.7e308)
    s = tensor_stats(a)
    assert s.norm == math.inf and s.l2_norm == math.inf and tensor_norm(a) == math.inf
    assert s.mean == pytest.approx(1.7e308, rel=1e-15) and s.std < 1e-15 * 1.7e308
    assert (s.nan_count, s.inf_count) == (0, 0)
    np.testing.assert_array_equal(clip_by_norm(np.array([1.7e308, 1.7e308]), 1.0), [0.0, 0.0])


def test_std_is_stable_across_chunks():
    from gradtool.core.stats import StatsAccumulator

    a = 1e8 + np.arange(100, dtype=np.float64)  # large offset: naive E[x²]-E[x]² cancels catastrophically
    acc = StatsAccumulator()
    for i in range(0, 100, 7):
        acc.update(a[i:i + 7])
    s = acc.result(a.shape, "float64", True)
    assert s.std == pytest.approx(np.std(np.arange(100.0)), rel=1e-9)
    assert s.mean == pytest.approx(1e8 + 49.5, rel=1e-15)
    f = (1e3 + np.arange(100, dtype=np.float32))  # the float32 fast path recentres when the mean dominates
    assert tensor_stats(f).std == pytest.approx(np.std(np.arange(100.0)), rel=1e-6)


def test_streamed_equals_in_memory_across_chunk_boundaries():
    from gradtool.core.stats import STREAM_CHUNK, StatsAccumulator

    rng = np.random.default_rng(4)
    a = (rng.standard_normal(3 * STREAM_CHUNK + 1234) * 1e-3).astype(np.float32)
    a[::97] = 0
    whole = tensor_stats(a)
    for step in (1000, STREAM_CHUNK, 4096 * 3 + 5):
        acc = StatsAccumulator()
        for i in range(0, a.size, step):
            acc.update(a[i:i + step])
        s = acc.result(a.shape, "float32", True)
        assert s.zero_count == whole.zero_count and s.min == whole.min and s.max == whole.max
        assert s.norm == pytest.approx(whole.norm, rel=2e-7) and s.std == pytest.approx(whole.std, rel=1e-6)
        assert s.mean == pytest.approx(whole.mean, rel=1e-5, abs=1e-9)
    assert whole.norm == pytest.approx(ref_l2(a), rel=2e-7)
    d = a.astype(np.float64)
    assert whole.std == pytest.approx(d.std(), rel=1e-6) and whole.mean == pytest.approx(d.mean(), rel=1e-4, abs=1e-9)


def test_stats_norm_equals_tensor_norm_bit_for_bit():
    from gradtool import tensor_norm

    a = np.random.default_rng(5).standard_normal(300_001).astype(np.float32)
    assert tensor_stats(a).norm == tensor_norm(a)
    # float64 goes through BLAS dots whose summation order depends on the CPU's SIMD width: both within
    # a few hundred ulp of the exact value (5e-15 seen on AVX2, 0 on AVX-512), not bit for bit.
    d = a.astype(np.float64)
    exact = math.sqrt(math.fsum((d * d).tolist()))
    assert tensor_stats(d).norm == pytest.approx(exact, rel=1e-13)
    assert tensor_norm(d) == pytest.approx(exact, rel=1e-13)


def test_huge_and_tiny_values_in_stats():
    s = tensor_stats(np.array([1e30, -1e30, 1e-30], np.float32))
    assert s.norm == pytest.approx(ref_l2(np.array([1e30, -1e30, 1e-30], np.float32)), rel=1e-12)
    s = tensor_stats(np.array([1e200, 1e200]))
    assert s.norm == pytest.approx(math.sqrt(2) * 1e200, rel=1e-14)
    s = tensor_stats(np.array([3e-200, 4e-200]))
    assert s.norm == pytest.approx(5e-200, rel=1e-14)


_nonfinite = st.sampled_from([np.nan, -np.nan, np.inf, -np.inf])
_odd_values = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, 3e4, -7.5, 1e200, 5e-310])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([np.float32, np.float16, np.float64, ml_dtypes.bfloat16]),
       st.lists(st.integers(0, 3000), min_size=1, max_size=4), _nonfinite, st.lists(_odd_values, max_size=12),
       st.integers(0, 2**32 - 1), st.sampled_from([1.0, 2.0, math.inf]))
def test_numpy_chunks_with_nan_and_inf_have_the_array_api_paths_statistics(dtype, sizes, first, odd, seed, p):
    """Chunks with NaN or ±inf (and extreme values), which the compiled summary does not decide, are taken by
    StatsAccumulator._numpy_chunk for NumPy arrays (in this thread's buffers, NaN and ±inf told apart
    only where some are found, no squares summed where either is): every field of the result is the
    Array API path's, bit for bit (array-api-strict's arrays take it), the counts, extremes, mean and
    std of the finite elements, and the norms (NaN or inf where NaN or ±inf are)."""
    import dataclasses

    import array_api_strict as xps

    from gradtool.core.stats import StatsAccumulator

    rng = np.random.default_rng(seed)
    chunks = []
    for n in sizes:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            c = (rng.standard_normal(n) * 10.0 ** rng.integers(-5, 6)).astype(np.float64)
            if n:  # (each chunk with NaN or ±inf: a finite one takes NumPy's fast path, other sums)
                c[rng.integers(0, n, len(odd) + 1)] = [first, *odd]
                c[rng.integers(0, n)] = first
            chunks.append(c.astype(dtype))
    results = []
    for namespace in (None, xps):
        acc = StatsAccumulator(p, xp=namespace)
        for c in chunks:
            if namespace is None:
                acc.update(c)
            elif c.dtype.itemsize == 2:  # (array-api-strict has no 16-bit floats: their float32 values)
                acc.update(xps.asarray(c.astype(np.float32)))
            else:
                acc.update(xps.asarray(c))
        got = acc.result((sum(sizes),), np.dtype(dtype).name, True)
        results.append(repr(dataclasses.astuple(got)))
    assert results[0] == results[1]
