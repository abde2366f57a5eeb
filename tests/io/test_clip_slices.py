"""clip --mode norm --axes over a tensor's trailing axes (rows) or leading axes (columns), streamed
(_clip_slices): the same files, reports and norms as clipping each tensor whole (the path it replaced,
still taken for other axes), on slices that cross chunk boundaries, in every format and NaN policy."""

import dataclasses
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gradtool.clip_dump as clip_module
from gradtool import open_dump, save_dump
from gradtool.clip_dump import ClipSpec, clip_dump
from gradtool.errors import NonFiniteError
from gradtool.io.base import DeferredDtype
from gradtool.io.dump import make_writer

EXT = {"npz": "npz", "safetensors": "safetensors", "hdf5": "h5"}


def _clip(src, out, spec, fmt, whole, monkeypatch):
    """(report, {name: (dtype, shape, bytes)} of the output); ``whole``: every tensor clipped in memory."""
    with monkeypatch.context() as m:
        if whole:
            m.setattr(clip_module, "_slice_layout", lambda spec, info: None)
        else:
            calls = []
            real = clip_module._clip_slices
            m.setattr(clip_module, "_clip_slices", lambda *a: calls.append(a[2].name) or real(*a))
        with open_dump(src) as r, make_writer(out, fmt, r.metadata) as w:
            rep = clip_dump(r, w, spec)
    with open_dump(out) as r:
        tensors = {n: (r.info(n).dtype.str, r.info(n).shape, r.read(n).tobytes()) for n in r.names}
    return rep, tensors, (None if whole else calls)


def _report(rep, exact_norms=True):
    rows = [dataclasses.astuple(t) for t in rep.tensors]
    if exact_norms:
        return repr(rows), repr((rep.global_norm_before, rep.global_norm_after))
    return [(t.name, t.clipped, t.clipped_elements, t.threshold) for t in rep.tensors]


def _assert_close_norms(a, b):
    for x, y in zip(a.tensors, b.tensors):
        for u, v in ((x.norm_before, y.norm_before), (x.norm_after, y.norm_after)):
            assert (u is None and v is None) or (math.isnan(u) and math.isnan(v)) or u == pytest.approx(v, rel=1e-12)


_shapes = st.sampled_from([(5,), (3, 7), (7, 3), (4, 5, 6), (2, 3, 4, 5), (1, 33), (33, 1), (0, 4), (6, 0),
                           (300, 2), (40, 3, 2), (129, 5)])


@settings(max_examples=60, deadline=None)
@example(shape=(5,), axes="-1", dtype="float64", chunk=1, policy="zero", nan=True, c=0.5, fmt="npz", seed=3)
@given(shape=_shapes, axes=st.sampled_from(["-1", "1,2", "-2,-1", "2,3", "0", "0,1", "1", "0,2", "all"]),
       dtype=st.sampled_from(["float32", "float16", "bfloat16", "float64"]), chunk=st.sampled_from([1, 7, 64, 1000]),
       policy=st.sampled_from(["propagate", "zero"]), nan=st.booleans(), c=st.sampled_from([0.5, 3.0, 1e9]),
       fmt=st.sampled_from(["npz", "safetensors", "hdf5"]), seed=st.integers(0, 3))
def test_streamed_slices_equal_the_whole_tensor(tmp_path_factory, shape, axes, dtype, chunk, policy, nan, c, fmt,
                                                seed):
    """Chunks of 1 to 1,000 elements (slices cut anywhere): the same output bytes and changed counts,
    norms to 1e-12 (a chunk's sum of squares is rounded once, so other cuts move their last bits; the
    test below keeps the real chunk size for them)."""
    ndim = len(shape)
    ax = tuple(range(ndim)) if axes == "all" else tuple(int(a) for a in axes.split(","))
    if any(a >= ndim or a < -ndim for a in ax):
        return
    tmp = tmp_path_factory.mktemp("slices")
    rng = np.random.default_rng(seed)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    t = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 10.0], size=shape[-1:] if shape else ())).astype(np_dtype)
    if nan and t.size:
        t.reshape(-1)[rng.integers(0, t.size)] = np.nan
    if dtype == "bfloat16":  # only safetensors holds it
        fmt = "safetensors"
    src = str(tmp / f"in.{EXT[fmt]}")
    save_dump(src, {"w": t, "b": np.ones(3, np.float32)})
    spec = ClipSpec("norm", max=c, axes=ax, nonfinite=policy, select=["w"])
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(clip_module, "STREAM_CHUNK", chunk)
        streamed, s_files, sliced = _clip(src, str(tmp / f"s.{EXT[fmt]}"), spec, fmt, False, monkeypatch)
        whole, w_files, _ = _clip(src, str(tmp / f"w.{EXT[fmt]}"), spec, fmt, True, monkeypatch)
    assert _report(streamed, False) == _report(whole, False)
    _assert_close_norms(streamed, whole)
    norms_before = [repr([t.norm_before for t in r.tensors]) for r in (streamed, whole)]
    if sliced or norms_before[0] == norms_before[1]:
        assert s_files == w_files
    else:  # axes over the whole tensor: one norm, taken in chunks of ``chunk`` by the streamed path and in
        # the library's chunks by the whole one, so its last bits (float64 squares are rounded) and the
        # scale's may differ; the slices' norms are taken alike, and so are the norms of the same cuts
        assert s_files["b"] == w_files["b"]
        assert s_files["w"][:2] == w_files["w"][:2]
        a, b = (np.frombuffer(f["w"][2], np_dtype).astype(np.float64) for f in (s_files, w_files))
        ulp = 1e-12 if np_dtype == np.float64 else float(ml_dtypes.finfo(np_dtype).eps)  # (a rounding flips)
        np.testing.assert_allclose(a, b, rtol=ulp, equal_nan=True)


@pytest.mark.parametrize("fmt", ["npz", "safetensors", "hdf5"])
@pytest.mark.parametrize("shape,axes,dtype", [
    ((700, 613), (-1,), np.float32), ((3, 400, 450), (1, 2), np.float32), ((613, 700), (1,), np.float16),
    ((300, 1001), (-1,), np.float64), ((2, 300_000), (-1,), ml_dtypes.bfloat16),  # rows
    ((700, 613), (0,), np.float32), ((40, 30, 450), (0, 1), np.float32), ((1001, 300), (0,), np.float64),
    ((613, 700), (0,), np.float16), ((150_001, 2), (0,), ml_dtypes.bfloat16)])  # columns
@pytest.mark.parametrize("policy", ["propagate", "zero"])
def test_at_the_real_chunk_size_every_bit_is_the_same(tmp_path, monkeypatch, fmt, shape, axes, dtype, policy):
    """Tensors of 260k-600k elements (slices across the 2^18-element chunks): the same files, the same
    report, norms bit for bit; the slice path was taken."""
    if fmt != "safetensors" and dtype == ml_dtypes.bfloat16:
        pytest.skip("only safetensors holds bfloat16")
    rng = np.random.default_rng(1)
    t = (rng.standard_normal(shape) * np.geomspace(1e-3, 1e2, shape[-1])).astype(dtype)
    t.reshape(-1)[[5, 300_001]] = [np.nan, np.inf]
    src = str(tmp_path / f"in.{EXT[fmt]}")
    save_dump(src, {"w": t, "u": rng.standard_normal((9,) * len(shape)).astype(np.float32)})
    spec = ClipSpec("norm", max=5.0, axes=axes, nonfinite=policy)
    streamed, s_files, calls = _clip(src, str(tmp_path / f"s.{EXT[fmt]}"), spec, fmt, False, monkeypatch)
    whole, w_files, _ = _clip(src, str(tmp_path / f"w.{EXT[fmt]}"), spec, fmt, True, monkeypatch)
    assert calls == ["w", "u"] and s_files == w_files and _report(streamed) == _report(whole)
    assert streamed.tensors[0].clipped_elements > 0


def test_nan_under_the_error_policy_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    t = np.ones((400, 1000), np.float32)
    t[399, 999] = np.nan
    src = str(tmp_path / "in.safetensors")
    save_dump(src, {"w": t})
    with pytest.raises(NonFiniteError, match="NaN/Inf in w"):
        _clip(src, str(tmp_path / "out.safetensors"), ClipSpec("norm", max=1.0, axes=(-1,)), "safetensors",
              False, monkeypatch)


def test_a_step_with_no_slice_to_clip_is_copied_and_counts_nothing(tmp_path, monkeypatch):
    t = np.random.default_rng(0).standard_normal((500, 600)).astype(np.float32)
    src = str(tmp_path / "in.safetensors")
    save_dump(src, {"w": t})
    rep, files, _ = _clip(src, str(tmp_path / "out.safetensors"), ClipSpec("norm", max=1e6, axes=(-1,)),
                          "safetensors", False, monkeypatch)
    assert files["w"][2] == t.tobytes() and not rep.tensors[0].clipped
    assert rep.tensors[0].norm_before == rep.tensors[0].norm_after


def test_memory_is_a_few_chunks_not_the_tensor(tmp_path, monkeypatch):
    """The whole-tensor path held the tensor, a float64 copy and their products: the streamed one never
    asks the reader for more than a chunk of whole slices."""
    t = np.random.default_rng(0).standard_normal((1000, 1500)).astype(np.float32)  # 6 MB, 1.5M elements
    src = str(tmp_path / "in.safetensors")
    save_dump(src, {"w": t})
    biggest = []
    from gradtool.io.safetensors import SafetensorsReader

    real = SafetensorsReader.iter_chunks

    def spy(self, info, chunk_elements=1 << 16):
        biggest.append(chunk_elements)
        return real(self, info, chunk_elements)

    monkeypatch.setattr(SafetensorsReader, "iter_chunks", spy)
    monkeypatch.setattr(SafetensorsReader, "_read", lambda *a: pytest.fail("read whole"))
    out = str(tmp_path / "out.safetensors")
    with open_dump(src) as r, make_writer(out, "safetensors", r.metadata) as w:
        rep = clip_dump(r, w, ClipSpec("norm", max=1.0, axes=(-1,)))
    assert rep.tensors[0].clipped_elements == t.size
    assert biggest and max(biggest) <= clip_module.STREAM_CHUNK


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_column_norms_by_the_kernel_are_numpys(tmp_path, monkeypatch, dtype):
    """Pass A by columns of float32/float16/bfloat16 goes through the compiled ``column_sumsq`` where it is
    built, and gives the NumPy path's norms bit for bit (blocks of rows carried across chunks, NaN and
    ±inf in their columns)."""
    from gradtool.core import kernels

    if kernels.compiled_column_sumsq is None:
        pytest.skip("compiled kernel not built")
    rng = np.random.default_rng(4)
    t = (rng.standard_normal((2000, 301)) * np.geomspace(1e-4, 1e3, 301)).astype(dtype)
    t[7, 3], t[1500, 300] = np.nan, np.inf
    src = str(tmp_path / "in.safetensors")
    save_dump(src, {"w": t})
    calls = []
    real = kernels.compiled_column_sumsq
    monkeypatch.setattr(kernels, "compiled_column_sumsq", lambda *a: calls.append(1) or real(*a))
    def column_norms(r, deferred=False):
        info = r.info("w")
        if deferred:  # (as the reader gives it when ml_dtypes is not imported: see io.base.DeferredDtype)
            info = dataclasses.replace(info, dtype=DeferredDtype("bfloat16", 2))
        blocks, bits = clip_module._slice_blocks(r, info, 301 * 97, "propagate", "columns")
        assert (bits is not None) == deferred
        return clip_module._column_norms(blocks, info, 301, "propagate", np, bits)

    with open_dump(src) as r:
        by_kernel = column_norms(r)
        as_bits = column_norms(r, True) if dtype == ml_dtypes.bfloat16 else by_kernel  # (bits, in the kernel)
        with kernels.disabled():
            by_numpy = column_norms(r)
    assert len(calls) == -(-2000 // 97) * (2 if dtype == ml_dtypes.bfloat16 else 1)
    assert by_kernel.tobytes() == by_numpy.tobytes() == as_bits.tobytes()
    assert np.isnan(by_kernel[3]) and np.isinf(by_kernel[300]) and np.isfinite(by_kernel[:3]).all()
