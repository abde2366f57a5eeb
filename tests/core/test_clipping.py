import math

import ml_dtypes
import numpy as np
import pytest

from gradtool import clip_by_average_norm, clip_by_global_norm, clip_by_norm, clip_by_value
from gradtool.errors import NonFiniteError, UsageError
from tests.conftest import to_np
from tests.reference import RTOL, ref_clip_by_global_norm, ref_clip_by_norm


# ---- the seed documents' worked examples -------------------------------------------------------------
def test_clip_by_value_example(xp):
    out = clip_by_value(xp.asarray([-1.0, 2.0, 10.0]), 0.0, 3.0)
    assert to_np(out).tolist() == [0.0, 2.0, 3.0]


def test_clip_by_norm_example(xp):
    t = xp.asarray([-2.0, 3.0, 6.0])
    np.testing.assert_allclose(to_np(clip_by_norm(t, 5.0)), np.array([-2, 3, 6]) * 5 / 7, rtol=1e-15)
    assert clip_by_norm(t, 9.0) is t  # norm 7 <= 9: unchanged, the same object


def test_clip_by_global_norm_example(xp):
    a, b = xp.asarray([-2.0, 3.0, 6.0]), xp.asarray([-4.0, 6.0, 12.0])
    (ca, cb), n = clip_by_global_norm([a, b], 14.5)
    assert n == pytest.approx(math.sqrt(245), rel=1e-15)
    s = 14.5 / math.sqrt(245)
    np.testing.assert_allclose(to_np(ca), [-2 * s, 3 * s, 6 * s], rtol=1e-15)
    np.testing.assert_allclose(to_np(cb), [-4 * s, 6 * s, 12 * s], rtol=1e-15)
    np.testing.assert_allclose(to_np(ca), [-1.8527, 2.7791, 5.5582], atol=1e-4)
    np.testing.assert_allclose(to_np(cb), [-3.7055, 5.5582, 11.1165], atol=1e-4)


# ---- dtypes against the float64 reference ----------------------------------------------------------
DTYPES = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_clip_by_norm_matches_tf_formula_per_dtype(dtype):
    rng = np.random.default_rng(1)
    t = (rng.standard_normal((7, 5)) * 10).astype(dtype)
    name = np.dtype(dtype).name
    for c in (0.5, 3.0, 1e6):
        out = clip_by_norm(t, c)
        assert out.dtype == t.dtype
        np.testing.assert_allclose(out.astype(np.float64), ref_clip_by_norm(t.astype(np.float64), c), rtol=RTOL[name],
                                   atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_clip_by_global_norm_matches_tf_per_dtype(dtype):
    rng = np.random.default_rng(2)
    ts = [(rng.standard_normal(s) * 3).astype(dtype) for s in [(4, 3), (10,), (2, 2, 2)]]
    ref, n_ref = ref_clip_by_global_norm([t.astype(np.float64) for t in ts], 2.0)
    out, n = clip_by_global_norm(ts, 2.0)
    assert n == pytest.approx(n_ref, rel=1e-12)
    for o, r, t in zip(out, ref, ts):
        assert o.dtype == t.dtype
        np.testing.assert_allclose(o.astype(np.float64), r, rtol=RTOL[np.dtype(dtype).name])


def test_unclipped_is_bit_identical_even_where_tf_is_not():
    # TF multiplies by fl(c * fl(1/c)) which is not 1 for c = 41, 47, 55 in float32
    t = np.array([1.1, -2.3, 0.7], np.float32)
    for c in (41.0, 47.0, 55.0):
        (out,), _ = clip_by_global_norm([t], c)
        assert out.tobytes() == t.tobytes()
        assert clip_by_norm(t, c).tobytes() == t.tobytes()


# ---- axes -------------------------------------------------------------------------------------------
def test_clip_by_norm_axes_including_negative(xp):
    t = xp.asarray([[3.0, 4.0], [0.0, 1.0], [0.0, 0.0]])
    out = to_np(clip_by_norm(t, 1.0, axes=[-1]))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 1.0], [0.0, 0.0]], rtol=1e-15)
    out0 = to_np(clip_by_norm(t, 1.0, axes=0))
    np.testing.assert_allclose(out0, ref_clip_by_norm(to_np(t), 1.0, axes=0), rtol=1e-15)
    assert to_np(clip_by_norm(t, 1.0, axes=[1]))[1].tolist() == [0.0, 1.0]  # slice at the threshold is untouched


def test_axes_out_of_range(xp):
    with pytest.raises(UsageError, match="out of range"):
        clip_by_norm(xp.asarray([1.0, 2.0]), 1.0, axes=[1])
    with pytest.raises(UsageError):
        clip_by_norm(xp.asarray([[1.0]]), 1.0, axes=[0, -2])


# ---- average norm -------------------------------------------------------------------------------------
def test_clip_by_average_norm_is_norm_over_size_not_rms(xp):
    t = xp.asarray([3.0, 4.0])  # norm 5, size 2: average norm 2.5 (RMS would be 3.54)
    assert clip_by_average_norm(t, 2.5) is t
    out = to_np(clip_by_average_norm(t, 1.0))
    np.testing.assert_allclose(out, ref_clip_by_norm([3.0, 4.0], 2.0), rtol=1e-15)
    assert np.linalg.norm(out) / 2 == pytest.approx(1.0)


# ---- edge cases ------------------------------------------------------------------------------------------
def test_empty_and_zero_tensors(xp):
    e = xp.asarray(np.zeros((0, 3), np.float32))
    assert clip_by_norm(e, 1.0) is e
    assert clip_by_average_norm(e, 1.0) is e
    z = xp.asarray(np.zeros(4))
    assert clip_by_norm(z, 1.0) is z
    (ce, cz), n = clip_by_global_norm([e, z], 1.0)
    assert n == 0.0 and ce is e and cz is z


def test_none_entries_are_kept(xp):
    out, n = clip_by_global_norm([None, xp.asarray([30.0, 40.0]), None], 5.0)
    assert out[0] is None and out[2] is None
    np.testing.assert_allclose(to_np(out[1]), [3.0, 4.0])
    assert n == 50.0


def test_integer_tensors_pass_through_untouched(xp):
    i = xp.asarray(np.array([100, -100], np.int32))
    assert clip_by_value(i, -1, 1) is i
    assert clip_by_norm(i, 1.0) is i
    (oi, of), n = clip_by_global_norm([i, xp.asarray([3.0, 4.0])], 1.0)
    assert oi is i and n == 5.0
    b = np.array([True, False])
    assert clip_by_norm(b, 0.1) is b


def test_use_norm_replaces_computed_norm(xp):
    t = xp.asarray([3.0, 4.0])
    (o,), n = clip_by_global_norm([t], 1.0, use_norm=10.0)
    assert n == 10.0
    np.testing.assert_allclose(to_np(o), [0.3, 0.4], rtol=1e-15)
    (o,), n = clip_by_global_norm([t], 1.0, use_norm=0.5)
    assert o is t


@pytest.mark.parametrize("c", [0.0, -1.0, math.nan, math.inf, "x"])
def test_nonsense_thresholds_are_usage_errors(xp, c):
    t = xp.asarray([1.0])
    with pytest.raises(UsageError):
        clip_by_norm(t, c)
    with pytest.raises(UsageError):
        clip_by_global_norm([t], c)
    with pytest.raises(UsageError):
        clip_by_average_norm(t, c)


def test_value_bounds_checked(xp):
    t = xp.asarray([1.0])
    with pytest.raises(UsageError, match="<="):
        clip_by_value(t, 2.0, 1.0)
    with pytest.raises(UsageError):
        clip_by_value(t, math.nan, 1.0)
    with pytest.raises(UsageError):
        clip_by_global_norm([t], 1.0, use_norm=-1.0)


def test_value_bounds_broadcast_but_never_grow(xp):
    t = xp.asarray([[1.0, 5.0], [-5.0, 0.5]])
    out = to_np(clip_by_value(t, xp.asarray([-1.0, -2.0]), xp.asarray([1.0, 2.0])))
    assert out.tolist() == [[1.0, 2.0], [-1.0, 0.5]]
    with pytest.raises(UsageError, match="broadcast"):
        clip_by_value(xp.asarray([1.0]), 0.0, xp.asarray([1.0, 2.0]))


def test_value_clip_is_elementwise_bit_identical():
    t = np.array([0.1, 5.0, -0.3], np.float32)
    out = clip_by_value(t, -1.0, 1.0)
    assert out[0].tobytes() == t[0].tobytes() and out[2].tobytes() == t[2].tobytes() and out[1] == 1.0
    assert clip_by_value(t, -10.0, 10.0) is t


# ---- non-finite policies ------------------------------------------------------------------------------------
def test_nonfinite_error_names_the_tensor(xp):
    with pytest.raises(NonFiniteError) as e:
        clip_by_global_norm([xp.asarray([1.0]), xp.asarray([math.nan])], 1.0)
    assert e.value.where == [1]
    with pytest.raises(NonFiniteError):
        clip_by_norm(xp.asarray([math.inf]), 1.0)
    with pytest.raises(NonFiniteError):
        clip_by_value(xp.asarray([math.nan]), 0.0, 1.0)


def test_propagate_reproduces_tensorflow_global(xp):
    # TF: scale = c*min(1/n, 1/c) + (n - n) -> NaN when n is inf: every element of every tensor NaN
    out, n = clip_by_global_norm([xp.asarray([1.0, 2.0]), xp.asarray([math.inf])], 1.0, nonfinite="propagate")
    assert n == math.inf
    assert all(np.isnan(to_np(o)).all() for o in out)


def test_propagate_reproduces_tensorflow_clip_by_norm(xp):
    # TF: t*c / max(inf, c): finite -> 0, inf -> NaN
    out = to_np(clip_by_norm(xp.asarray([1.0, -2.0, math.inf]), 1.0, nonfinite="propagate"))
    assert out[0] == 0.0 and out[1] == 0.0 and math.copysign(1, out[1]) == -1 and math.isnan(out[2])
    out = to_np(clip_by_value(xp.asarray([math.nan, math.inf, -math.inf]), -1.0, 1.0, nonfinite="propagate"))
    assert math.isnan(out[0]) and out[1] == 1.0 and out[2] == -1.0


def test_zero_policy_replaces_nonfinite_first(xp):
    out, n = clip_by_global_norm([xp.asarray([3.0, math.nan]), xp.asarray([math.inf, 4.0])], 100.0, nonfinite="zero")
    assert n == 5.0
    assert to_np(out[0]).tolist() == [3.0, 0.0] and to_np(out[1]).tolist() == [0.0, 4.0]
    assert to_np(clip_by_norm(xp.asarray([6.0, math.nan, 8.0]), 5.0, nonfinite="zero")).tolist() == pytest.approx([3, 0, 4])


def test_bad_policy():
    with pytest.raises(UsageError):
        clip_by_norm(np.ones(2), 1.0, nonfinite="ignore")


def test_inputs_are_never_modified():
    t = np.array([30.0, 40.0])
    keep = t.copy()
    clip_by_norm(t, 1.0)
    clip_by_global_norm([t], 1.0)
    clip_by_value(t, 0.0, 1.0)
    clip_by_norm(np.array([np.nan, 1.0]), 1.0, nonfinite="zero")
    assert np.array_equal(t, keep)
