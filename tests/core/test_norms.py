import math

import ml_dtypes
import numpy as np
import pytest

from gradtool import global_norm, tensor_norm
from gradtool.core.norms import CHUNK_ELEMENTS, ROW, combine_norms, parse_norm_type
from gradtool.errors import UsageError
from tests.reference import ref_l2


def test_l2_matches_reference_on_every_backend(xp):
    a = np.random.default_rng(0).standard_normal(10_001)
    for np_dtype, rel in ((np.float32, 2e-7), (np.float64, 1e-12)):
        host = a.astype(np_dtype)
        assert tensor_norm(xp.asarray(host)) == pytest.approx(ref_l2(host), rel=rel)


def test_float16_squares_do_not_overflow():
    # TF squares in float16 (300² = 90000 > 65504 -> inf -> NaN soup); gradtool accumulates in float64
    assert tensor_norm(np.array([300, 400], np.float16)) == 500.0
    assert global_norm([np.array([300, 400], np.float16)]) == 500.0


def test_bfloat16_norm_exact():
    x = np.array([3e30, 4e30], dtype=ml_dtypes.bfloat16)
    ref = ref_l2(x.astype(np.float64))
    assert tensor_norm(x) == pytest.approx(ref, rel=1e-12)


def test_large_finite_float32_is_not_inf(xp):
    # squares of 1e20 overflow float32 (max ~3.4e38); the norm must stay finite
    x = xp.asarray(np.array([1e20, 1e20, -3e38], np.float32))
    assert math.isfinite(tensor_norm(x))
    assert tensor_norm(x) == pytest.approx(ref_l2(np.array([1e20, 1e20, -3e38], np.float32)), rel=1e-12)


def test_float64_overflow_and_underflow_rescaled(xp):
    big = xp.asarray(np.array([1e200, 1e200]))
    assert tensor_norm(big) == pytest.approx(math.sqrt(2) * 1e200, rel=1e-14)
    tiny = xp.asarray(np.array([3e-200, 4e-200]))
    assert tensor_norm(tiny) == pytest.approx(5e-200, rel=1e-14)
    assert global_norm([big, big]) == pytest.approx(2e200, rel=1e-14)


def test_empty_and_zero(xp):
    assert tensor_norm(xp.asarray(np.zeros((0, 3), np.float32))) == 0.0
    assert tensor_norm(xp.asarray(np.zeros(5))) == 0.0
    assert global_norm([]) == 0.0
    assert global_norm([None, None]) == 0.0


def test_nan_and_inf_propagate(xp):
    assert math.isnan(tensor_norm(xp.asarray([1.0, math.nan])))
    assert tensor_norm(xp.asarray([1.0, math.inf])) == math.inf
    assert math.isnan(tensor_norm(xp.asarray([math.inf, math.nan])))
    assert math.isnan(global_norm([xp.asarray([1.0]), xp.asarray([math.nan])]))


def test_norm_types_follow_pytorch_total_norm(xp):
    a, b = np.array([-2.0, 3, 6]), np.array([-4.0, 6, 12])
    xa, xb = xp.asarray(a), xp.asarray(b)
    assert global_norm([xa, xb], 1) == 33.0
    assert global_norm([xa, xb], "inf") == 12.0
    assert global_norm([xa, xb], 2) == pytest.approx(math.sqrt(245), rel=1e-15)
    assert tensor_norm(xa, 1) == 11.0 and tensor_norm(xa, math.inf) == 6.0


def test_none_and_ints_are_skipped_in_global_norm(xp):
    assert global_norm([None, xp.asarray([3.0, 4.0]), xp.asarray([100, 100])]) == 5.0


@pytest.mark.parametrize("bad", [0, 3, -1, "two", None, 0.5])
def test_bad_norm_type(bad):
    with pytest.raises(UsageError):
        parse_norm_type(bad)


def test_combine_norms_never_overflows():
    assert combine_norms([1e300, 1e300]) == pytest.approx(math.sqrt(2) * 1e300)


@pytest.mark.parametrize("n", [1, ROW - 1, ROW, ROW + 1, CHUNK_ELEMENTS - 1, CHUNK_ELEMENTS + 3, 2 * CHUNK_ELEMENTS + ROW + 7])
def test_fast_path_equals_exact_path_across_chunk_boundaries(n):
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)).astype(np.float32)
    assert tensor_norm(a) == pytest.approx(ref_l2(a), rel=2e-7)
    h = a.astype(np.float16)
    assert tensor_norm(h) == pytest.approx(ref_l2(h), rel=2e-7)


def test_accuracy_ten_million_float32_against_fsum():
    rng = np.random.default_rng(42)
    a = (rng.standard_normal(10_000_000) * np.exp(rng.standard_normal(10_000_000) * 3)).astype(np.float32)
    d = a.astype(np.float64)
    exact = math.sqrt(math.fsum((d * d).tolist()))
    assert abs(tensor_norm(a) - exact) / exact < 1e-7
    # what the stance guards against: a plain float32 dot is measurably worse on such data
    naive = float(np.sqrt(np.dot(a, a)))
    assert abs(naive - exact) / exact > abs(tensor_norm(a) - exact) / exact


def test_non_contiguous_input():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    assert tensor_norm(a) == pytest.approx(ref_l2(a), rel=1e-12)


def test_global_norm_fast_path_for_many_small_tensors():
    from tests.reference import ref_global

    rng = np.random.default_rng(11)
    ts = [rng.standard_normal(int(rng.integers(1, 5000))).astype(np.float32) for _ in range(300)]
    ts += [rng.standard_normal((3, 7)).astype(np.float16), None, np.arange(5), rng.standard_normal(9000).astype(np.float32)]
    assert global_norm(ts) == pytest.approx(ref_global([t for t in ts if t is not None and t.dtype.kind == "f"]), rel=1e-7)
    nan = ts[:50] + [np.array([np.nan], np.float32)]
    assert math.isnan(global_norm(nan))
    inf = ts[:50] + [np.array([np.inf], np.float32)]
    assert global_norm(inf) == math.inf
    big = [np.full(10, 1e20, np.float32)] * 20  # float32 squares overflow: the exact path takes over
    assert global_norm(big) == pytest.approx(float(np.float32(1e20)) * math.sqrt(200), rel=1e-12)


# NormOfPieces: a stream cut anywhere gives tensor_norm of the whole, bit for bit

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_PIECES_X = {dt: (np.random.default_rng(7).standard_normal(2 * CHUNK_ELEMENTS + 12_345) *
                  np.geomspace(1e-3, 1e3, 2 * CHUNK_ELEMENTS + 12_345)).astype(dt)
             for dt in (np.float32, np.float16, ml_dtypes.bfloat16, np.float64)}


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(list(_PIECES_X)), cuts=st.lists(st.integers(0, 2 * CHUNK_ELEMENTS + 12_345),
                                                             max_size=12))
def test_norm_of_pieces_is_tensor_norm_of_the_whole(dtype, cuts):
    from gradtool.core.norms import NormOfPieces

    x = _PIECES_X[dtype]
    bounds = [0, *sorted(cuts), x.shape[0]]
    acc = NormOfPieces(x.dtype)
    for a, b in zip(bounds, bounds[1:]):
        acc.add(x[a:b])  # empty pieces too
    assert acc.result() == tensor_norm(x)
    assert acc.result() == pytest.approx(ref_l2(x), rel=1e-6)


def test_norm_of_pieces_with_nan_and_a_small_chunk():
    from gradtool.core.norms import NormAccumulator, NormOfPieces

    x = np.arange(1000, dtype=np.float32) / 7
    acc, whole = NormOfPieces(x.dtype, chunk=64), NormAccumulator(2.0)
    for a in range(0, 1000, 37):
        acc.add(x[a:a + 37])
    for a in range(0, 1000, 64):
        whole.update(x[a:a + 64])
    assert acc.result() == whole.result()
    acc = NormOfPieces(x.dtype, chunk=64)
    acc.add(np.array([1.0, np.nan], np.float32))
    assert math.isnan(acc.result())


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_a_chunk_of_zeros_skips_the_float64_pass_and_tiny_values_do_not(dtype, monkeypatch):
    """A chunk the kernel sees as all ±0 adds 0 without the three float64 passes (a float16 tensor
    clipped to nothing: 40 % of clip's time); one whose squares underflow float32 (1e-30; bfloat16's
    subnormals) is still redone in float64, and NaN and ±inf still found."""
    from gradtool.core import kernels
    from gradtool.core.norms import NormAccumulator

    exact = []
    real = NormAccumulator._exact
    monkeypatch.setattr(NormAccumulator, "_exact", lambda self, c, xp: exact.append(c.size) or real(self, c, xp))
    zeros = np.zeros(1000, dtype)
    zeros[::7] = -0.0
    assert tensor_norm(zeros) == 0.0
    kernel = kernels.compiled_half_summaries if dtype != np.float32 else kernels.compiled_f32_summary
    assert exact == ([] if kernel is not None else [1000])
    if dtype != np.float16:  # (every float16 square is a normal float32: none underflows)
        tiny = np.zeros(5000, dtype)  # (past 4,096 elements: the kernel's float32 partial sums, not float64)
        tiny[3] = -1e-30 if dtype == np.float32 else -float(ml_dtypes.finfo(dtype).smallest_subnormal)
        assert tensor_norm(tiny) == pytest.approx(abs(float(tiny[3])), rel=1e-6)
        assert exact[-1] == 5000
    for bad, want in ((np.nan, math.isnan), (np.inf, math.isinf)):
        x = np.zeros(1000, dtype)
        x[5] = bad
        assert want(tensor_norm(x))
