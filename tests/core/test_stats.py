import math

import ml_dtypes
import numpy as np
import pytest

from gradtool import tensor_stats
from gradtool.core import stats as stats_mod
from tests.reference import ref_l2


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


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_stats_low_precision(dtype):
    a = np.array([300, 400, -1], dtype=dtype)
    s = tensor_stats(a)
    assert s.norm == pytest.approx(ref_l2(a.astype(np.float64)), rel=1e-12)
    assert s.dtype == np.dtype(dtype).name


def test_std_is_stable_across_chunks(monkeypatch):
    monkeypatch.setattr(stats_mod, "_flat_chunks",
                        lambda x, xp, chunk=7: stats_mod.__dict__["_flat_chunks"].__wrapped__(x, xp, 7)
                        if hasattr(stats_mod._flat_chunks, "__wrapped__") else _chunks(x, xp, 7))
    a = 1e8 + np.arange(100, dtype=np.float64)  # large offset: naive E[x²]-E[x]² cancels catastrophically
    s = tensor_stats(a)
    assert s.std == pytest.approx(np.std(np.arange(100.0)), rel=1e-9)
    assert s.mean == pytest.approx(1e8 + 49.5, rel=1e-15)


def _chunks(x, xp, chunk):
    flat = xp.reshape(x, (-1,))
    for i in range(0, flat.shape[0], chunk):
        yield flat[i:i + chunk]
