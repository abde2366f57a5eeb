"""The fast paths give the answers of the simple ones (hypothesis, across chunk and row boundaries)."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import global_norm, tensor_norm, tensor_stats
from gradtool.core.norms import ROW, NormAccumulator, combine_norms
from gradtool.core.stats import StatsAccumulator
from tests.reference import ref_l2

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
