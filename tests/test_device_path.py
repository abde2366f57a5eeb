"""The device (CuPy) code path of the commands, run on the CPU through array-api-strict: the same
summaries and clipped tensors as the NumPy host path. Value clipping gives the same bytes; the modes that
scale by a norm agree to two ulps: the two paths sum squares in different orders (a GPU's reduction order
differs again), so their float64 norms, and a float64 tensor's scale, differ in the last bits or two, and
a last-bit difference in the norm can round a float32 scale one ulp apart, which moves a product by up to
two of its own ulps."""

import math

import numpy as np
import pytest

from gradtool import open_dump, save_dump
from gradtool.clip_dump import ClipSpec, clip_dump
from gradtool.io.dump import make_writer
from gradtool.summarize import summarize_dump

xps = pytest.importorskip("array_api_strict")


@pytest.fixture
def dump(tmp_path):
    rng = np.random.default_rng(3)
    p = str(tmp_path / "d.npz")
    save_dump(p, {"w": rng.standard_normal((50, 40)).astype(np.float32), "b": rng.standard_normal(9),
                  "i": np.arange(4), "z": np.zeros(3, np.float32)})
    return p


def test_summaries_match(dump):
    with open_dump(dump) as r:
        host = dict(summarize_dump(r).tensors)
    with open_dump(dump) as r:
        dev = dict(summarize_dump(r, xp=xps).tensors)
    for name in host:
        h, d = host[name], dev[name]
        assert (h.size, h.zero_count, h.nan_count) == (d.size, d.zero_count, d.nan_count)
        for k in ("norm", "mean", "std", "max_abs"):
            assert math.isclose(getattr(h, k), getattr(d, k), rel_tol=2e-7, abs_tol=1e-12), (name, k)


@pytest.mark.parametrize("spec", [ClipSpec("global-norm", max=1.0), ClipSpec("norm", max=0.5),
                                  ClipSpec("norm", max=0.5, axes=(-1,)), ClipSpec("value", max=0.1),
                                  ClipSpec("average-norm", max=1e-3)])
def test_clipped_bytes_match(dump, tmp_path, spec):
    outs = {}
    for label, xp in (("host", None), ("device", xps)):
        out = str(tmp_path / f"{label}.npz")
        with open_dump(dump) as r, make_writer(out, "npz", r.metadata) as w:
            rep = clip_dump(r, w, spec, xp=xp)
        outs[label] = (out, rep)
    with open_dump(outs["host"][0]) as a, open_dump(outs["device"][0]) as b:
        for n in a.names:
            ha, da = a.read(n), b.read(n)
            assert ha.dtype == da.dtype and ha.shape == da.shape, n
            if spec.mode == "value" or not np.issubdtype(ha.dtype, np.floating):
                assert ha.tobytes() == da.tobytes(), n
            else:
                np.testing.assert_array_max_ulp(ha, da, maxulp=2)
    assert [t.clipped for t in outs["host"][1].tensors] == [t.clipped for t in outs["device"][1].tensors]
