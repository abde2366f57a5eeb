"""Reading tensors in chunks (bounded memory) gives exactly the bytes of a whole read, in every layout."""

import os

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import open_dump, save_dump


def chunks_equal_whole(reader, step):
    for info in reader.tensors:
        whole = np.ascontiguousarray(reader.read(info.name))
        parts = [c.copy() for c in reader.iter_chunks(info, step)]
        got = np.concatenate(parts) if parts else np.zeros(0, info.dtype)
        if np.isfortran(whole) or reader.format in ("npy", "npz") and whole.ndim > 1 and not whole.flags.c_contiguous:
            whole = whole.T
        assert np.array_equal(np.sort(got), np.sort(whole.reshape(-1)), equal_nan=True), info.name
        assert all(p.size <= max(step, info.size // max(info.shape[0], 1) if info.shape else 1) for p in parts)


TENSORS = {
    "big": np.arange(10_000, dtype=np.float32).reshape(100, 100),
    "odd": np.linspace(-1, 1, 777).astype(np.float16),
    "ints": np.arange(50, dtype=np.int64),
    "scalar": np.array(3.0),
    "empty": np.zeros((0, 3), np.float32),
    "bools": np.array([True, False, True]),
}


@pytest.mark.parametrize("ext", ["npz", "h5", "safetensors"])
@pytest.mark.parametrize("step", [1, 333, 4096, 1 << 16])
def test_chunks_match_whole_reads(tmp_path, ext, step):
    p = str(tmp_path / f"d.{ext}")
    save_dump(p, TENSORS)
    with open_dump(p) as r:
        chunks_equal_whole(r, step)


def test_compressed_npz_and_fortran_and_big_endian(tmp_path):
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, a=np.arange(5000.0).reshape(50, 100), f=np.asfortranarray(np.arange(12.0).reshape(3, 4)),
                        be=np.arange(10, dtype=">f4"))
    with open_dump(p) as r:
        chunks_equal_whole(r, 100)
        be = r.info("be")
        assert np.concatenate([c.copy() for c in r.iter_chunks(be, 3)]).tolist() == list(range(10))
    q = str(tmp_path / "s.npz")
    np.savez(q, f=np.asfortranarray(np.arange(12.0).reshape(3, 4)), be=np.arange(10, dtype=">f8"))
    with open_dump(q) as r:
        chunks_equal_whole(r, 5)
        assert np.concatenate([c.copy() for c in r.iter_chunks(r.info("be"), 4)]).dtype.isnative


def test_hdf5_chunked_gzip_and_contiguous(tmp_path):
    p = str(tmp_path / "g.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("gz", data=np.arange(3000.0).reshape(30, 100), compression="gzip", chunks=(7, 100))
        f.create_dataset("contig", data=np.arange(999, dtype=np.float32))
        f.create_dataset("wide", data=np.ones((2, 50_000), np.float32))
    with open_dump(p) as r:
        chunks_equal_whole(r, 256)


def test_streamed_stats_equal_in_memory_stats(tmp_path):
    from gradtool import tensor_stats
    from gradtool.summarize import summarize_dump

    rng = np.random.default_rng(0)
    t = {"w": rng.standard_normal((300, 700)).astype(np.float32), "h": rng.standard_normal(70_001).astype(np.float16),
         "d": rng.standard_normal(5000), "n": np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)}
    for ext in ("npz", "h5", "safetensors"):
        p = str(tmp_path / f"s.{ext}")
        save_dump(p, t)
        with open_dump(p) as r:
            s = dict(summarize_dump(r).tensors)
        for name, a in t.items():
            ref = tensor_stats(a)
            got = s[name]
            assert (got.nan_count, got.inf_count, got.zero_count, got.size) == (ref.nan_count, ref.inf_count, ref.zero_count, ref.size)
            if np.isnan(ref.norm):
                assert np.isnan(got.norm)
            else:
                assert got.norm == ref.norm  # same chunking, same kernel: the same bits
            assert got.mean == pytest.approx(ref.mean, rel=1e-9, abs=1e-12) and got.max_abs == ref.max_abs


def test_gradtool_npz_members_are_64_byte_aligned_and_numpy_still_reads_them(tmp_path):
    p = str(tmp_path / "a.npz")
    names = {"a": np.arange(10.0), "bb/ü": np.ones(7, np.float32), "c" * 40: np.zeros(3, np.float16)}
    save_dump(p, names)
    with open_dump(p) as r:
        for info in r.tensors:
            off = r._stored_data_offset(info)
            assert off % 64 == 0, info.name
    with np.load(p) as z:
        assert all(np.array_equal(z[k], v) for k, v in names.items())
    import zipfile

    assert zipfile.ZipFile(p).testzip() is None


def test_compressed_npz_summary_in_parallel_equals_serial(tmp_path):
    from gradtool import tensor_stats
    from gradtool.summarize import summarize_dump

    rng = np.random.default_rng(2)
    t = {f"t{i}": rng.standard_normal(int(rng.integers(1, 200_000))).astype(np.float32) for i in range(12)}
    t["nan"] = np.array([np.nan, 1.0], np.float32)
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, **t)
    with open_dump(p) as r:
        assert r.compressed
        got = dict(summarize_dump(r).tensors)
    assert list(got) == list(t)
    for name, a in t.items():
        ref = tensor_stats(a)
        assert got[name].nan_count == ref.nan_count and got[name].zero_count == ref.zero_count
        assert got[name].norm == ref.norm or (np.isnan(ref.norm) and np.isnan(got[name].norm))


def test_inflate_whole_checks_crc(tmp_path):
    from gradtool.errors import InputError

    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, a=np.zeros(100_000, np.float32))
    data = bytearray(open(p, "rb").read())
    cd = data.rfind(b"PK\x01\x02")  # the central directory's CRC-32 is the one checked
    data[cd + 16] ^= 0xFF
    open(p, "wb").write(bytes(data))
    with pytest.raises(InputError, match="CRC|corrupt"):
        with open_dump(p) as r:
            r.read("a")


@pytest.mark.parametrize("where", ["data", "npy header", "central directory"])
def test_stored_member_read_checks_crc(tmp_path, where):
    """read() of a stored member (pread straight into the array) checks the member's CRC-32 as zipfile
    does: a flipped byte in its data or in its .npy header, or a wrong CRC in the directory, is an error."""
    from gradtool.errors import InputError

    p = str(tmp_path / "s.npz")
    a = np.arange(100_000, dtype=np.float32)
    np.savez(p, a=a)
    data = bytearray(open(p, "rb").read())
    if where == "central directory":
        data[data.rfind(b"PK\x01\x02") + 16] ^= 0xFF
    elif where == "data":
        data[data.find(a[5000:5002].tobytes())] ^= 0x01
    else:  # a space of the header's padding becomes another harmless character
        header = data.find(b"{'descr'")
        data[data.find(b"    ", header)] = ord("\t")
    open(p, "wb").write(bytes(data))
    with open_dump(p) as r:
        with pytest.raises(InputError, match=r"s.npz: member 'a.npy' is corrupt \(bad CRC-32\)"):
            r.read("a")


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<f8", "|b1", "<i2", ">u8", "<f2"])
@pytest.mark.parametrize("shape", [(0,), (7,), (300, 257), (2, 0, 3), ()])
def test_stored_member_read_equals_numpy(tmp_path, order, dtype, shape):
    rng = np.random.default_rng(len(shape))
    a = np.asarray(rng.standard_normal(shape) * 100).astype(dtype)
    a = np.asfortranarray(a) if order == "F" else a
    p = str(tmp_path / "s.npz")
    np.savez(p, a=a, b=a[..., :1] if a.ndim else a)
    with open_dump(p) as r, np.load(p) as ref:
        for name in ("a", "b"):
            got = r.read(name)
            want = ref[name]
            assert got.shape == want.shape and got.dtype == want.dtype.newbyteorder("=")
            np.testing.assert_array_equal(got, want)


def test_hdf5_writer_streams_rows_from_odd_chunks(tmp_path):
    from gradtool.io.base import TensorInfo
    from gradtool.io.hdf5 import Hdf5Writer

    a = np.arange(7 * 300 * 5, dtype=np.float32).reshape(7 * 300, 5)
    b = np.arange(11, dtype=np.float64)
    p = str(tmp_path / "s.h5")
    w = Hdf5Writer(p, {"step": 1})
    for t, step in ((a, 997), (b, 3)):
        flat = t.reshape(-1)
        w.add_chunks(TensorInfo("g/" + str(t.ndim), t.shape, t.dtype),
                     (flat[i:i + step] for i in range(0, flat.size, step)))
    w.close()
    with open_dump(p) as r:
        assert np.array_equal(r.read("g/2"), a) and np.array_equal(r.read("g/1"), b)


@pytest.mark.parametrize("mode,max_", [("global-norm", 1.0), ("norm", 0.5), ("average-norm", 1e-4),
                                       ("global-norm", 1e30)])
@pytest.mark.parametrize("nonfinite", ["propagate", "zero"])
@pytest.mark.parametrize("ext", ["npz", "safetensors", "h5", "numpy.npz"])
def test_clip_with_fused_scale_kernel_equals_numpy_steps(tmp_path, monkeypatch, mode, max_, nonfinite, ext):
    """The compiled scale-count-measure pass (float32, and float64's own) gives the same output bytes and
    the same report (norms after to the bit, changed-element counts) as the NumPy multiply, compare and
    norm steps: scaling chunks in
    place in the read buffer (tensors at a file offset) as well as from a memory map into a second one,
    across chunk boundaries and short tails, at aligned and unaligned (``np.savez``) offsets."""
    import dataclasses

    from gradtool.clip_dump import ClipSpec, clip_dump
    from gradtool.core import kernels
    from gradtool.core.stats import STREAM_CHUNK
    from gradtool.io.base import DumpReader
    from gradtool.io.dump import make_writer

    if kernels.compiled_f32_scale is None:
        pytest.skip("compiled kernel not built")
    rng = np.random.default_rng(3)
    big = rng.standard_normal(300_001).astype(np.float32)  # a whole stream chunk and a ROW-sized rest
    big[[5, 70_000]] = [np.nan, np.inf]
    big[rng.random(big.size) < 0.1] = 0.0
    tensors = {"big": big, "small": rng.standard_normal(100).astype(np.float32),
               "tail": rng.standard_normal(2 * STREAM_CHUNK + 1000).astype(np.float32),  # a rest under ROW
               "f64": rng.standard_normal(5000), "be": rng.standard_normal(9000).astype(">f4"),
               "wide": rng.standard_normal(STREAM_CHUNK + 333)}  # float64 of two chunks
    if ext == "safetensors":
        del tensors["be"]  # little-endian only
    src = str(tmp_path / f"in.{ext}")
    if ext == "numpy.npz":
        np.savez(src, **tensors)  # members at unaligned offsets
    else:
        save_dump(src, tensors)
    calls, in_place, lengths, wide = [], [], [], []
    real, real64 = kernels.compiled_f32_scale, kernels.compiled_f64_scale
    monkeypatch.setattr(kernels, "compiled_f32_scale",
                        lambda *a: calls.append(a[0] is a[2]) or lengths.append(len(a[0])) or real(*a))
    if real64 is not None:
        monkeypatch.setattr(kernels, "compiled_f64_scale", lambda *a: wide.append(len(a[0])) or real64(*a))
    chunks_into = DumpReader.chunks_into
    monkeypatch.setattr(DumpReader, "chunks_into", lambda self, location, info, *a: in_place.append(info.name)
                        or chunks_into(self, location, info, *a))
    results = []
    for fused in (True, False):
        fmt = {"h5": "hdf5", "numpy.npz": "npz"}.get(ext, ext)
        out = str(tmp_path / f"out_{fused}.{ext.split('.')[-1]}")
        if not fused:  # only the fused pass off: the norms' own kernel stays, so norms compare to the bit
            monkeypatch.setattr(kernels, "compiled_f32_scale", None)
            monkeypatch.setattr(kernels, "compiled_f64_scale", None)
        with open_dump(src) as r:
            with make_writer(out, fmt, r.metadata) as w:
                rep = clip_dump(r, w, ClipSpec(mode=mode, max=max_, nonfinite=nonfinite))
        with open_dump(out) as r:
            results.append(({n: r.read(n) for n in r.names},
                            [dataclasses.astuple(t) for t in rep.tensors], rep.global_norm_after))
    (a, rep_a, after_a), (b, rep_b, after_b) = results
    for n in tensors:
        np.testing.assert_array_equal(a[n].view(np.uint8), b[n].view(np.uint8))
    assert repr(rep_a) == repr(rep_b) and repr(after_a) == repr(after_b)  # repr: NaN == NaN
    # the fused pass ran wherever something was scaled (a NaN global norm scales by NaN, as TF does)
    assert bool(calls) == (max_ < 1e30 or (mode == "global-norm" and nonfinite == "propagate"))
    # float64 tensors too, a tensor of two chunks among them (its NaN and ±inf: tests/core/test_kernels.py),
    # but not by a NaN scale (the global norm of "big"'s NaN under propagate): NumPy's product then
    nan_scale = mode == "global-norm" and nonfinite == "propagate"
    assert real64 is None or (bool(wide) == (bool(calls) and not nan_scale) and (not wide or max(wide) > 5000))
    # in place (source and output the same buffer), read at the tensors' file offsets; under "zero" too:
    # "big"'s NaN and inf zeroed there first, scaled or not (clip_dump._zeroed_in_place), the others
    # holding none, so left as they are by zeroing
    assert all(calls)
    assert "big" in in_place if nonfinite == "zero" else bool(in_place) == bool(calls)
    # short chunks too (the 100-element tensor, the 1000-element rest of "tail"): the kernel sums them
    # in float64, as the NumPy steps do
    assert not calls or sorted(n for n in lengths if n < 4096) == [100, 1000]
    if mode == "global-norm" and max_ == 1.0 and nonfinite == "zero":
        assert rep_a[0][3] and rep_a[0][4] > 200_000  # the big tensor really was scaled


@pytest.mark.parametrize("ext", ["npz", "safetensors", "h5", "compressed.npz"])
@pytest.mark.parametrize("nonfinite", ["error", "propagate"])
@pytest.mark.parametrize("mode,max_", [("global-norm", 100.0), ("norm", 50.0), ("average-norm", 1e-3), ("value", 2.0)])
def test_clip_norm_pass_on_two_threads_equals_one(tmp_path, monkeypatch, ext, nonfinite, mode, max_):
    """Clip's first pass through the parallel statistics path (members inflated two at a time for a
    compressed npz) gives the norms (and so the scales, the report and the output bytes) of the serial
    chunk-by-chunk pass, bit for bit: the global norm, and each tensor's norm in the per-tensor modes."""
    import dataclasses

    import gradtool.summarize as summarize
    from gradtool.clip_dump import ClipSpec, clip_dump
    from gradtool.errors import NonFiniteError
    from gradtool.io.dump import make_writer

    monkeypatch.setattr(summarize, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(summarize, "PIECE_BYTES", 1 << 20)  # several pieces per tensor
    rng = np.random.default_rng(7)
    tensors = {"a": rng.standard_normal((700, 1000)).astype(np.float32),
               "b": (rng.standard_normal(123_457) * 1e-3).astype(np.float32),
               "ints": np.arange(10), "c": rng.standard_normal(3000), "empty": np.zeros((0, 4), np.float32),
               "be": rng.standard_normal(5000).astype(">f4"), "half": rng.standard_normal(5000).astype(np.float16),
               "big_half": (rng.standard_normal(600_001) * 1e-3).astype(np.float16)}  # (chunks and pieces)
    if ext == "safetensors":
        del tensors["be"]  # little-endian only
    if nonfinite == "propagate":
        tensors["b"][99_999] = np.inf
    src = str(tmp_path / f"in.{ext}")
    if ext == "compressed.npz":
        np.savez_compressed(src, **tensors)
    else:
        save_dump(src, tensors)
    calls = []
    real = summarize.stats_in_parallel

    def counted(*a, **k):
        result = real(*a, **k)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(summarize, "stats_in_parallel", counted)
    outcomes = []
    for parallel in (True, False):
        if not parallel:
            monkeypatch.setattr(summarize, "stats_in_parallel", lambda *a, **k: None)  # the serial pass
        out = str(tmp_path / f"out_{parallel}.{ext}")
        with open_dump(src) as r:
            try:
                with make_writer(out, "hdf5" if ext == "h5" else ext.replace("compressed.", ""), r.metadata) as w:
                    rep = clip_dump(r, w, ClipSpec(mode=mode, max=max_, nonfinite=nonfinite))
            except NonFiniteError as exc:
                outcomes.append(("error", str(exc)))
                continue
        with open_dump(out) as r:
            outcomes.append((repr([dataclasses.astuple(t) for t in rep.tensors]), rep.scale,
                             {n: r.read(n).tobytes() for n in r.names}))
    assert calls == [True] and outcomes[0] == outcomes[1]


def test_hdf5_writer_contiguous_fast_path_bytes_layout_and_errors(tmp_path):
    """Uncompressed tensors are written with pwrite into their pre-allocated contiguous storage: the file
    reads back exactly through h5py (big-endian input converted to native, attributes kept, gzip ones
    still chunked), nothing else in the file is disturbed, and a short or long stream is an error."""
    import h5py

    from gradtool.io.base import TensorInfo
    from gradtool.io.hdf5 import Hdf5Writer

    rng = np.random.default_rng(5)
    tensors = {"a/w": rng.standard_normal((300, 70)).astype(">f4"), "a/b": rng.standard_normal(70),
               "ints": np.arange(1000, dtype=np.int16), "gz": rng.standard_normal((50, 40)).astype(np.float32)}
    p = str(tmp_path / "w.h5")
    w = Hdf5Writer(p, {"step": 3})
    for name, t in tensors.items():
        flat = t.reshape(-1)
        info = TensorInfo(name, t.shape, t.dtype, attrs={"units": 7},
                          compression="gzip" if name == "gz" else None, compression_opts=4 if name == "gz" else None)
        w.add_chunks(info, (flat[i:i + 333] for i in range(0, flat.size, 333)))
    w.set_group_attrs("a", {"kind": "block"})
    w.close()
    with h5py.File(p, "r") as f:
        for name, t in tensors.items():
            d = f[name]
            assert d.dtype.isnative and d.attrs["units"] == 7
            np.testing.assert_array_equal(d[...], t)
            layout = d.id.get_create_plist().get_layout()
            assert layout == (h5py.h5d.CHUNKED if name == "gz" else h5py.h5d.CONTIGUOUS)
        assert f.attrs["step"] == 3 and f["a"].attrs["kind"] == "block"
    for n, bad in ((100, "wrote 99 of 100"), (99, "more elements")):
        w = Hdf5Writer(str(tmp_path / f"bad{n}.h5"))
        stream = [np.ones(99 if n == 100 else 50, np.float32), np.ones(0 if n == 100 else 50, np.float32)]
        with pytest.raises(RuntimeError, match=bad):
            w.add_chunks(TensorInfo("x", (99,) if n == 99 else (100,), np.dtype(np.float32)), iter(stream))
        w.close()


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), max_size=12), depth=st.integers(1, 4), stop_after=st.integers(0, 15))
def test_read_ahead_yields_the_chunks_in_order_and_stops_cleanly(sizes, depth, stop_after):
    """Chunks that reuse one buffer (as readers' do) come out of a read-ahead thread equal and in order;
    a caller that stops early stops the worker and closes the source."""
    import threading

    from gradtool.io.base import read_ahead

    closed = []

    def source():
        buf = np.empty(max(sizes, default=0) + 1)
        try:
            for k, n in enumerate(sizes):
                buf[:n] = np.arange(n) + 1000 * k
                yield buf[:n]
        finally:
            closed.append(True)

    before = threading.active_count()
    got = []
    gen = read_ahead(source(), depth)
    for k, c in enumerate(gen):
        if k == stop_after:
            break
        got.append(c.copy())
    gen.close()
    assert [g.tolist() for g in got] == [(np.arange(n) + 1000 * k).tolist() for k, n in enumerate(sizes[:len(got)])]
    assert closed == [True] and threading.active_count() == before


def test_read_ahead_raises_the_sources_error_in_the_caller():
    from gradtool.errors import InputError
    from gradtool.io.base import read_ahead

    def source():
        yield np.ones(3)
        raise InputError("x.npz: member 'a.npy' is corrupt")

    gen = read_ahead(source())
    assert next(gen).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(InputError, match="corrupt"):
        next(gen)


def test_compressed_npz_chunks_ahead_equal_chunks(tmp_path):
    """A deflated member read ahead gives iter_chunks' values (non-native byte order and bool included);
    a stored member is not read ahead, nor a deflated one of less than READ_AHEAD_BYTES (a thread a
    member cost more than it overlapped)."""
    rng = np.random.default_rng(3)
    t = {"w": rng.standard_normal(300_001).astype(np.float32), "be": rng.standard_normal(7000).astype(">f8"),
         "m": rng.random(5000) < 0.5, "e": np.zeros(0, np.float32)}
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, **t)
    with open_dump(p) as r:
        for info in r.tensors:
            plain = np.concatenate([c.copy() for c in r.iter_chunks(info, 4096)] or [np.zeros(0, info.dtype)])
            ahead = np.concatenate([c.copy() for c in r.iter_chunks_ahead(info, 4096)] or [np.zeros(0, info.dtype)])
            assert ahead.tobytes() == plain.tobytes() == np.asarray(t[info.name], info.dtype.newbyteorder("=")).tobytes()
            threaded = r.iter_chunks_ahead(info, 4096).gi_code.co_name == "read_ahead"
            assert threaded == (info.name == "w")  # (1.2 MB; "be", 56 kB, inflated by the caller's thread)
    s = str(tmp_path / "s.npz")
    save_dump(s, t)
    with open_dump(s) as r:
        assert r.iter_chunks_ahead(r.info("w")).gi_code.co_name != "read_ahead"  # no thread for page-cache reads


@pytest.mark.parametrize("ext", ["npz", "safetensors", "h5"])
@pytest.mark.parametrize("mode,max_", [("global-norm", 1e-3), ("norm", 0.05), ("average-norm", 1e-6)])
def test_clip_of_half_precision_tensors_in_the_kernel_equals_the_numpy_steps(tmp_path, monkeypatch, ext, mode,
                                                                              max_):
    """float16 (and, in safetensors, bfloat16) tensors are scaled, counted and measured by the compiled
    kernel (half_scale; their norms before by half_summaries): the clipped bytes and the report equal the
    NumPy steps' (scale_tensor's float32 multiply rounded once; NaN kept under "propagate"), bit for bit,
    with tensors of several chunks, subnormal results and a tensor left unclipped."""

    from gradtool.clip_dump import ClipSpec
    from gradtool.core import kernels
    from gradtool.core.stats import STREAM_CHUNK

    if kernels.compiled_half_scale is None:
        pytest.skip("compiled kernel not built")
    rng = np.random.default_rng(3)
    tensors = {"big": (rng.standard_normal(2 * STREAM_CHUNK + 77) * 0.05).astype(np.float16),
               "small": (rng.standard_normal(999) * 1e-3).astype(np.float16),
               "tiny_values": (rng.standard_normal(5000) * 1e-6).astype(np.float16),
               "f32": rng.standard_normal(3000).astype(np.float32)}
    tensors["small"][3] = np.nan  # the "propagate" policy keeps it
    src = _saved_with_bfloat16(tmp_path, ext, tensors, rng)
    calls = []
    real = kernels.compiled_half_scale
    outcomes = []
    for fast in (True, False):
        if fast:
            monkeypatch.setattr(kernels, "compiled_half_scale", lambda *a: calls.append(a[3]) or real(*a))
        else:
            monkeypatch.setattr(kernels, "compiled_half_scale", None)
            monkeypatch.setattr(kernels, "compiled_half_summaries", None)
        outcomes.append(_clip_outcome(src, str(tmp_path / f"out_{fast}.{ext}"),
                                      ClipSpec(mode=mode, max=max_, nonfinite="propagate")))
    assert outcomes[0] == outcomes[1]
    assert calls and set(calls) == ({0, 1} if ext == "safetensors" else {0})


def _saved_with_bfloat16(tmp_path, ext, tensors, rng):
    """``tensors`` saved as ``in.EXT`` (with a bfloat16 tensor of more than one chunk where the format
    holds one: safetensors), its path."""
    import ml_dtypes

    from gradtool.core.stats import STREAM_CHUNK

    if ext == "safetensors":
        tensors["bf"] = (rng.standard_normal(STREAM_CHUNK + 5) * 0.02).astype(ml_dtypes.bfloat16)
    src = str(tmp_path / f"in.{ext}")
    save_dump(src, tensors)
    return src


def _clip_outcome(src, out, spec):
    """What clipping ``src`` into ``out`` (its format by its extension) gives: the report's rows, the
    scale and every tensor's bytes, or ("refused", the message) for NaN/Inf under the "error" policy."""
    import dataclasses

    from gradtool.clip_dump import clip_dump
    from gradtool.errors import NonFiniteError
    from gradtool.io.dump import make_writer

    ext = out.rsplit(".", 1)[1]
    try:
        with open_dump(src) as r, make_writer(out, "hdf5" if ext == "h5" else ext, r.metadata) as w:
            rep = clip_dump(r, w, spec)
    except NonFiniteError as exc:
        return "refused", str(exc)
    with open_dump(out) as r:
        return (repr([dataclasses.astuple(t) for t in rep.tensors]), rep.scale,
                {n: r.read(n).tobytes() for n in r.names})


@pytest.mark.parametrize("ext", ["safetensors", "npz", "h5"])
@pytest.mark.parametrize("policy", ["propagate", "zero", "error"])
def test_clip_by_value_in_the_kernel_equals_the_numpy_steps(tmp_path, monkeypatch, ext, policy):
    """``clip --mode value`` clips float32, float64, float16 and bfloat16 chunks in the compiled kernel
    (``clip_values``): the clipped bytes and the report equal clip_by_value's NumPy steps, bit for bit,
    under every NaN policy ("error" refuses the same tensor, with the same error), with tensors of several
    chunks, NaN and ±inf, and a tensor with nothing to clip."""

    from gradtool.clip_dump import ClipSpec
    from gradtool.core import kernels
    from gradtool.core.stats import STREAM_CHUNK

    if kernels.compiled_clip_values is None:
        pytest.skip("compiled kernel not built")
    rng = np.random.default_rng(5)
    tensors = {"big": (rng.standard_normal(2 * STREAM_CHUNK + 77) * 0.05).astype(np.float32),
               "half": (rng.standard_normal(STREAM_CHUNK + 999) * 0.05).astype(np.float16),
               "odd": np.array([np.nan, np.inf, -np.inf, 0.5, -0.0, 1e-9] * 100, np.float32),
               "calm": (rng.standard_normal(3000) * 1e-6).astype(np.float32),
               "wide": rng.standard_normal(2 * STREAM_CHUNK + 5) * 0.05}
    tensors["wide"][[3, STREAM_CHUNK + 1]] = [np.nan, -np.inf]
    if policy == "error":
        del tensors["odd"]
        tensors["half"][7] = np.inf  # refused, by both paths alike
    src = _saved_with_bfloat16(tmp_path, ext, tensors, rng)
    calls = []
    real = kernels.compiled_clip_values
    outcomes = []
    for fast in (True, False):
        monkeypatch.setattr(kernels, "compiled_clip_values", (lambda *a: calls.append(a[4]) or real(*a))
                            if fast else None)
        outcomes.append(_clip_outcome(src, str(tmp_path / f"out_{fast}.{ext}"),
                                      ClipSpec(mode="value", max=0.02, nonfinite=policy)))
    assert outcomes[0] == outcomes[1]
    assert policy == "error" or set(calls) == ({-2, -1, 0, 1} if ext == "safetensors" else {-2, -1, 0})


_small = st.tuples(st.integers(0, 300), st.sampled_from(["float32", "float32", "float16", "float64"]),
                   st.sampled_from(["plain", "plain", "nan", "inf", "zeros", "huge"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_small, min_size=1, max_size=30), st.sampled_from(["safetensors", "npz", "h5"]),
       st.sampled_from(["error", "propagate"]), st.sampled_from([1e-3, 1e30]))
def test_clips_first_pass_over_small_tensors_many_to_a_call_is_the_tensor_by_tensor_one(
        tmp_path_factory, tensors, ext, nonfinite, max_):
    """In a dump too small for two threads, clip's global-norm pass takes its small float32 tensors' norms
    many to a kernel call (as stats does): the same report and the same output bytes as streaming each
    tensor (or the same refusal), and the progress counts every tensor of both passes."""
    import dataclasses

    from gradtool import summarize
    from gradtool.clip_dump import ClipSpec, NonFiniteError, clip_dump
    from gradtool.io.dump import make_writer

    d = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(len(tensors))
    arrays = {}
    for k, (size, dtype, kind) in enumerate(tensors):
        with np.errstate(over="ignore"):  # (huge: inf in float16)
            a = (rng.standard_normal(size) * (1e30 if kind == "huge" else 1.0)).astype(dtype)
        if kind == "zeros":
            a[:] = 0
        elif kind in ("nan", "inf") and size:
            a[size // 2] = np.nan if kind == "nan" else np.inf
        arrays[f"t{k}"] = a
    src = str(d / f"in.{ext}")
    save_dump(src, arrays)
    outcomes = []
    for batched in (True, False):
        with pytest.MonkeyPatch.context() as m:
            if not batched:
                m.setattr(summarize, "small_tensor_batches", lambda *a, **k: [])  # every tensor streamed
            out = str(d / f"out_{batched}.{ext}")
            ticks = []
            with open_dump(src) as r:
                try:
                    with make_writer(out, "hdf5" if ext == "h5" else ext, r.metadata) as w:
                        rep = clip_dump(r, w, ClipSpec(mode="global-norm", max=max_, nonfinite=nonfinite),
                                        on_tensor=ticks.append)
                except NonFiniteError as exc:
                    outcomes.append(("error", str(exc)))
                    continue
            with open_dump(out) as r:
                outcomes.append((repr([dataclasses.astuple(t) for t in rep.tensors]), rep.scale,
                                 repr(rep.global_norm_before), sum(ticks),
                                 {n: r.read(n).tobytes() for n in r.names}))
    assert outcomes[0] == outcomes[1]
    if outcomes[0][0] != "error":
        assert outcomes[0][3] == 2 * len(arrays)  # pass 1 and pass 2, every (floating-point) tensor


def _gzip_h5(path, arrays, rows=None):
    """An HDF5 file of ``arrays`` as h5py writes them with gzip, in h5py's chunks or in chunks of ``rows``
    first-axis rows (the last one an edge chunk); an empty one, which HDF5 cannot chunk, contiguous.
    InputError for bfloat16, which HDF5 does not hold."""
    from gradtool.errors import InputError

    if any(a.dtype.name == "bfloat16" for a in arrays.values()):
        raise InputError("no bfloat16 in HDF5")
    with h5py.File(path, "w", track_order=True) as f:
        for name, a in arrays.items():
            if a.size:
                chunks = None if rows is None else (min(rows, a.shape[0]),) + a.shape[1:]
                f.create_dataset(name, data=a, compression="gzip", chunks=chunks)
            else:
                f.create_dataset(name, data=a)


_run_dtypes = ["float32"] * 8 + ["float16", "bfloat16", "float64", "int32"]
_run_tensor = st.tuples(st.one_of(st.integers(1, 100), st.integers(0, 150)), st.sampled_from(_run_dtypes),
                        st.sampled_from(["plain"] * 6 + ["nan", "zeros"]))


@settings(max_examples=100, deadline=None)
@given(st.lists(_run_tensor, min_size=3, max_size=25),
       st.sampled_from(["safetensors", "npz", "h5", "npz-deflated", "h5-gzip"]),
       st.sampled_from(["propagate", "propagate", "zero", "error"]),
       st.sampled_from([1e-3, 1e-3, 30.0, 1e30]),
       st.booleans(), st.sampled_from([None, None, "t1*"]), st.sampled_from([300, 2000, 1 << 20]),
       st.sampled_from(["global-norm", "value", "norm", "average-norm"]), st.sampled_from([None, 7]))
def test_clips_small_tensors_a_run_at_a_time_as_one_at_a_time(tmp_path_factory, tensors, ext, nonfinite, max_,
                                                              dry, select, run_bytes, mode, rows):
    """Small tensors lying back to back, clipped a run at a time (one read, a kernel call each, one write:
    clip_dump._clip_run), by the global norm, by value or by each one's norm (some under their threshold,
    left as they are), give the report, progress and output bytes of clipping them one at a time (or the
    same refusal of NaN under "error"); runs broken by tensors too large for them (here over 100
    elements), of other types, not selected, holding NaN, or over the run's bytes, and by a global scale
    of 1. (An HDF5 file's gzip datasets are inflated a run at a time too, by its reader.)"""
    import dataclasses

    from gradtool import clip_dump as clip_mod
    from gradtool.clip_dump import ClipSpec, clip_dump
    from gradtool.errors import InputError, NonFiniteError
    from gradtool.io.dump import make_writer

    d = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(len(tensors))
    arrays = {}
    for k, (size, dtype, kind) in enumerate(tensors):
        a = (rng.standard_normal(size) * 100).astype(np.float32 if dtype == "bfloat16" else dtype)
        if dtype == "bfloat16":
            import ml_dtypes

            a = a.astype(ml_dtypes.bfloat16)
        if kind == "zeros":
            a[:] = 0
        elif kind == "nan" and size and dtype != "int32":
            a[size // 2] = np.nan
        arrays[f"t{k}"] = a
    deflated = ext == "npz-deflated"
    gzip = ext == "h5-gzip"
    ext = "npz" if deflated else "h5" if gzip else ext
    src = str(d / f"in.{ext}")
    try:
        if gzip:
            _gzip_h5(src, arrays, rows)
        else:
            save_dump(src, arrays, compress=deflated)
    except InputError:  # (a format that does not hold bfloat16)
        return
    outcomes = []
    for runs in (True, False):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(clip_mod, "RUN_ELEMENTS", 100)
            m.setattr(clip_mod, "RUN_BYTES", run_bytes)
            if not runs:
                m.setattr(clip_mod, "_small_runs", lambda *a, **k: {})  # one tensor at a time
            out = str(d / f"out_{runs}.{ext}")
            ticks = []
            spec = ClipSpec(mode=mode, max=max_, nonfinite=nonfinite, select=(select,) if select else ())
            try:
                with open_dump(src) as r:
                    if dry:
                        rep = clip_dump(r, None, spec, on_tensor=ticks.append)
                    else:
                        with make_writer(out, "hdf5" if ext == "h5" else ext, r.metadata, compress=deflated) as w:
                            rep = clip_dump(r, w, spec, on_tensor=ticks.append)
            except NonFiniteError as exc:
                outcomes.append(("refused", str(exc), exc.where))
                continue
            written = {}
            if not dry:
                with open_dump(out) as r:
                    written = {n: r.read(n).tobytes() for n in r.names}
                if ext != "h5":  # (the file itself: the same bytes; HDF5 files hold the time they were made)
                    with open(out, "rb") as f:
                        written["file"] = f.read()
            outcomes.append((repr([dataclasses.astuple(t) for t in rep.tensors]), rep.scale,
                             repr(rep.global_norm_after), sum(ticks), written))
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "npz-deflated", "h5-gzip"])
@pytest.mark.parametrize("mode", ["global-norm", "value", "norm"])
def test_a_dump_of_many_small_tensors_is_clipped_in_runs(tmp_path, monkeypatch, mode, fmt):
    """A dump of 3,000 small float32 tensors (and one of int32 between them): clipped in runs of at most
    RUN_BYTES, every float32 tensor in one, each run written with one call (with the compiled kernel,
    which scales or clips each; without it, none, and the same output): safetensors' tensors lie back to
    back, a stored npz's a zip and a .npy header apart (the run reads past them), a deflated npz's
    members and an HDF5 file's gzip datasets (in chunks of 64 elements, the last one cut) are inflated a
    run at a time."""
    from gradtool import clip_dump as clip_mod
    from gradtool.clip_dump import ClipSpec, clip_dump
    from gradtool.core import kernels
    from gradtool.io.dump import make_writer
    from gradtool.io.hdf5 import Hdf5Writer
    from gradtool.io.npz import NpzWriter
    from gradtool.io.safetensors import SafetensorsWriter

    rng = np.random.default_rng(0)
    arrays = {f"t{k:04d}": rng.standard_normal(int(rng.integers(1, 400))).astype(np.float32)
              for k in range(3000)}
    arrays["t1500"] = np.arange(7, dtype=np.int32)
    ext, deflated = fmt.split("-")[0], fmt.endswith(("deflated", "gzip"))
    if ext == "h5":
        _gzip_h5(str(tmp_path / "in.h5"), arrays, 64)
    else:
        save_dump(str(tmp_path / f"in.{ext}"), arrays, compress=deflated)
    runs, writes = [], []
    writer_class = {"safetensors": SafetensorsWriter, "npz": NpzWriter, "h5": Hdf5Writer}[ext]
    clip_run, add_run = clip_mod._clip_run, writer_class.add_run
    monkeypatch.setattr(clip_mod, "_clip_run", lambda *a, **k: runs.append(a[1]) or clip_run(*a, **k))
    monkeypatch.setattr(writer_class, "add_run", lambda self, infos, data: writes.append(len(infos))
                        or add_run(self, infos, data))
    monkeypatch.setattr(clip_mod, "RUN_BYTES", 64 << 10)
    with open_dump(str(tmp_path / f"in.{ext}")) as r, make_writer(str(tmp_path / f"out.{ext}"), r.format,
                                                                  r.metadata, compress=deflated) as w:
        rep = clip_dump(r, w, ClipSpec(mode=mode, max=10.0 if mode == "norm" else 1.0))
    assert (mode != "global-norm" or rep.scale < 1) and all(run.nbytes <= 64 << 10 for run in runs)
    assert all((run.fd < 0) == deflated and run.end - run.start <= 64 << 10 for run in runs)
    if (kernels.compiled_f32_scale if mode == "global-norm" else kernels.compiled_clip_values) is None:
        # no tensor scaled or clipped in a run; a compressed npz's norms before are known without the
        # kernel (inflated on threads), so its tensors under the threshold are copied in runs
        assert all(op is None for run in runs for _, _, op, _ in run.tensors)
        assert (deflated and mode == "norm") or (not runs and not writes)
        assert writes == [len(run.tensors) for run in runs]
    else:
        in_runs = sum(len(run.tensors) for run in runs)  # (value: not those whose norm before the batched
        assert len(runs) > 10 and (in_runs == 2999 if mode == "global-norm" else in_runs > 2950)  # summary
        if mode == "norm":  # (both kinds in runs: scaled, and left under the threshold)
            assert 0 < sum(op is None for run in runs for _, _, op, _ in run.tensors) < in_runs
        assert writes == [len(run.tensors) for run in runs]  # leaves to the stream: 1 or 2 elements)
    with open_dump(str(tmp_path / f"out.{ext}")) as r:
        for name, a in arrays.items():
            norm = {t.name: t.norm_before for t in rep.tensors}[name]  # (the report's: gradtool's sums)
            want = (a if a.dtype == np.int32 else np.clip(a, np.float32(-1), np.float32(1)) if mode == "value"
                    else (a * np.float32(rep.scale)).astype(np.float32) if mode == "global-norm"
                    else a if norm <= 10.0 else (a * np.float32(10.0 / norm)).astype(np.float32))
            assert r.read(name).tobytes() == want.tobytes(), name
    if mode == "value":
        clipped = {t.name: t.clipped_elements for t in rep.tensors}
        assert clipped == {n: 0 if a.dtype == np.int32 else int(np.count_nonzero(np.abs(a) > 1))
                           for n, a in arrays.items()}


@pytest.mark.parametrize("spec", [dict(mode="value", max=0.01, min=-0.5),
                                  dict(mode="value", max=0.05, thresholds={"t3": 0.001, "t7": 1.0}),
                                  dict(mode="norm", max=0.5, thresholds={"t3": 0.001, "t9": 100.0}),
                                  dict(mode="average-norm", max=0.01)])
def test_runs_keep_each_tensors_bounds(tmp_path, monkeypatch, spec):
    """In runs, each tensor is clipped by its own bounds: ``--min`` beside ``--max``, per-tensor
    thresholds (±, for value clipping), by its own norm; the bytes and the report of one at a time."""
    import dataclasses

    from gradtool import clip_dump as clip_mod
    from gradtool.clip_dump import ClipSpec, clip_dump
    from gradtool.io.dump import make_writer

    rng = np.random.default_rng(1)
    arrays = {f"t{i}": (rng.standard_normal(int(rng.integers(1, 300))) * 0.1).astype(np.float32)
              for i in range(200)}
    src = str(tmp_path / "in.safetensors")
    save_dump(src, arrays)
    outcomes, runs = [], []
    real = clip_mod._clip_run
    for in_runs in (True, False):
        monkeypatch.setattr(clip_mod, "_clip_run", lambda *a, **k: runs.append(a[1]) or real(*a, **k))
        if not in_runs:
            monkeypatch.setattr(clip_mod, "_small_runs", lambda *a, **k: {})
        out = str(tmp_path / f"out_{in_runs}.safetensors")
        with open_dump(src) as r, make_writer(out, "safetensors", r.metadata) as w:
            rep = clip_dump(r, w, ClipSpec(**spec))
        with open_dump(out) as r:
            outcomes.append((repr([dataclasses.astuple(t) for t in rep.tensors]),
                             {n: r.read(n).tobytes() for n in r.names}))
    assert outcomes[0] == outcomes[1]
    from gradtool.core import kernels

    assert runs or kernels.compiled_clip_values is None


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.sampled_from([1, 7, 4096, 262_144, 262_145, 600_000]), min_size=1, max_size=5),
       scale=st.sampled_from([6e-8, 1e-4, 1.0, 300.0, 6e4]), special=st.sampled_from([None, 0.0, np.nan, np.inf]),
       seed=st.integers(0, 2**32 - 1))
def test_float16_norms_of_the_parallel_pass_have_the_serial_bits(tmp_path_factory, sizes, scale, special, seed):
    """clip's first pass takes float16 tensors' norms by the statistics path on two cores (and small ones
    many to a kernel call): the bits of the serial chunk-by-chunk pass, subnormals, overflow to inf, zeros
    and NaN included (float16's range has no chunk the two send to float64 by different rules)."""
    _check_parallel_pass_bits(tmp_path_factory, np.float16, sizes, scale, special, seed)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([1, 7, 4096, 262_144, 262_145, 600_000]), min_size=1, max_size=5),
       scale=st.sampled_from([1e-38, 1e-20, 1e-13, 1e-4, 1.0, 3e4, 1e18, 1e20, 1e36]),
       special=st.sampled_from([None, 0.0, np.nan, np.inf, 1e-40, 3e38]), seed=st.integers(0, 2**32 - 1))
def test_bfloat16_norms_of_the_parallel_pass_have_the_serial_bits(tmp_path_factory, sizes, scale, special, seed):
    """As float16's, across bfloat16's range, float32's: chunks whose squares overflow float32 or whose
    sum is tiny (sent to float64 by NormAccumulator's rule on both paths), subnormals, NaN, inf."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    _check_parallel_pass_bits(tmp_path_factory, ml_dtypes.bfloat16, sizes, scale, special, seed)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.sampled_from([1, 7, 4096, 262_144, 262_145, 600_000]), min_size=1, max_size=5),
       scale=st.sampled_from([1e-310, 1e-160, 1e-20, 1.0, 1e20, 1e160, 1e300]),
       special=st.sampled_from([None, 0.0, np.nan, np.inf, 5e-324, 1.7e308]), seed=st.integers(0, 2**32 - 1),
       ext=st.sampled_from(["safetensors", "npz", "h5"]))
def test_float64_norms_of_the_parallel_pass_have_the_serial_bits(tmp_path_factory, sizes, scale, special, seed,
                                                                ext):
    """float64 tensors' norms taken on two cores, a piece of one chunk a task (so a tensor of several chunks
    is several tasks, merged): the serial pass's bits, in safetensors, npz (np.savez's members lie at
    unaligned offsets: read with pread) and HDF5, across float64's range (the scaled sums of chunks whose
    max |x| is outside 1e-150..1e150), NaN, inf."""
    _check_parallel_pass_bits(tmp_path_factory, np.float64, sizes, scale, special, seed, ext=ext,
                              float64_piece_chunks=1)


def _check_parallel_pass_bits(tmp_path_factory, dtype, sizes, scale, special, seed, ext="safetensors",
                              float64_piece_chunks=None):
    import struct

    import gradtool.clip_dump as clip_module
    import gradtool.summarize as summarize

    rng = np.random.default_rng(seed)
    tensors = {}
    for k, n in enumerate(sizes):
        with np.errstate(over="ignore"):
            a = (rng.standard_normal(n) * scale).astype(dtype)
        if special is not None:
            a[rng.integers(0, n)] = special
        tensors[f"t{k}"] = a
    src = str(tmp_path_factory.mktemp("f16") / f"in.{ext}")
    if ext == "npz":
        np.savez(src, **tensors)
    else:
        save_dump(src, tensors)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(summarize, "PARALLEL_MIN_BYTES", 0 if seed % 2 else 1 << 40)  # two cores, or small batches
        mp.setattr(summarize, "PIECE_BYTES", 1 << 19)
        if float64_piece_chunks is not None:
            mp.setattr(clip_module, "FLOAT64_PIECE_CHUNKS", float64_piece_chunks)
        with open_dump(src) as r:
            fast = clip_module._norms_in_parallel(r, list(tensors), 2.0, None, None)
            serial = {i.name: clip_module._norm_of(r, i, 2.0, "propagate", None) for i in r.tensors}
    if seed % 2 and (os.cpu_count() or 1) >= 2:
        assert set(fast) == set(tensors)  # every tensor went that way
    for name, norm in fast.items():
        assert struct.pack("<d", norm) == struct.pack("<d", serial[name]) or (np.isnan(norm) and np.isnan(serial[name]))


@pytest.mark.parametrize("case", ["one tiny value", "a value over 1e18"])
def test_float32_norms_of_the_parallel_pass_at_the_ends_of_the_range(tmp_path, monkeypatch, case):
    """The statistics path sent a float32 chunk to float64 by its max |x| (over 1e18, under 1e-18),
    NormAccumulator by its sum of squares (under 1e-25): a norm's last bits at those ends depended on which
    pass 1 a dump took (by its size: two cores from 32 MB). Now the sum of squares follows
    NormAccumulator's rule on both."""
    import struct

    import gradtool.clip_dump as clip_module
    import gradtool.summarize as summarize

    monkeypatch.setattr(summarize, "PARALLEL_MIN_BYTES", 0)
    a = np.zeros(600_000, np.float32)
    if case == "one tiny value":
        a[12_345] = 1.234567e-13  # max |x| within the statistics path's range, Σx² under 1e-25
    else:
        a[:] = np.random.default_rng(0).standard_normal(a.size) * 1e17
        a[5] = 1.5e18  # max |x| over 1e18, Σx² finite in float32
    src = str(tmp_path / "in.safetensors")
    save_dump(src, {"a": a})
    with open_dump(src) as r:
        if (os.cpu_count() or 1) < 2:
            pytest.skip("one core: pass 1 is the serial one")
        fast = clip_module._norms_in_parallel(r, ["a"], 2.0, None, None)["a"]
        serial = clip_module._norm_of(r, r.info("a"), 2.0, "propagate", None)
    assert struct.pack("<d", fast) == struct.pack("<d", serial)


def test_float64_norms_are_taken_serially_on_a_task_of_the_norm_pool(tmp_path, monkeypatch):
    """A caller that is itself a task of the norm pool gets nothing from the parallel float64 pass (its
    tensors are then streamed): waiting on the pool from inside it could deadlock."""
    import gradtool.clip_dump as clip_module
    import gradtool.summarize as summarize
    from gradtool.core.norms import _pool

    monkeypatch.setattr(summarize, "PARALLEL_MIN_BYTES", 0)
    src = str(tmp_path / "in.safetensors")
    save_dump(src, {"a": np.arange(600_000, dtype=np.float64)})
    with open_dump(src) as r:
        here = clip_module._float64_norms_in_parallel(r, ["a"], None)
        inside = _pool().submit(clip_module._float64_norms_in_parallel, r, ["a"], None).result(timeout=60)
    if (os.cpu_count() or 1) >= 2:
        assert set(here) == {"a"}
    assert inside == {}


@pytest.mark.parametrize("mode", ["global-norm", "value"])
def test_the_tensors_of_a_run_share_their_dtype_s_kernel_call(tmp_path, mode):
    """The runs' tensors of one dtype (and bounds) share one op, not a closure each (20,000 tensors: ~2 MB
    of clip's peak RSS), and the run clips them as the streaming path does (the test above)."""
    from gradtool.clip_dump import ClipSpec, _small_runs
    from gradtool.core import kernels

    if kernels.compiled_f32_scale is None:
        pytest.skip("no compiled kernel: no runs")
    path = str(tmp_path / "d.safetensors")
    arrays = {f"t{i}": np.full(10 + i, 1.0 + i, np.float32) for i in range(6)}
    arrays |= {f"h{i}": np.full(5, 2.0, np.float16) for i in range(3)}
    save_dump(path, arrays)
    spec = ClipSpec(mode=mode, max=1e-3)
    with open_dump(path) as reader:
        norms = {n: float(np.linalg.norm(a.astype(np.float64))) for n, a in arrays.items()}
        runs = _small_runs(reader, set(arrays), spec, 0.5, 2.0, norms)
        ops = {}
        for run in runs.values():
            for info, _, op, _ in run.tensors:
                ops.setdefault(info.dtype.name, set()).add(id(op))
    assert ops and all(len(ids) == 1 for ids in ops.values())
