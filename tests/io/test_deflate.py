"""Parallel deflate (gradtool/io/deflate.py): blocks compressed on threads, each primed with the input
before it, concatenate into one deflate stream that inflates to the input, with the same bytes whatever
the threads; the npz writer uses it for every deflated member it writes."""

import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import open_dump, save_dump
from gradtool.io import deflate, inflate

_libraries = [False] + ([True] if inflate.fast_zlib() is not zlib else [])  # isal when installed


def _compressed(data, writes, block, pool, level=None):
    d = deflate.ParallelDeflater(pool, level=level, block=block)
    out, pos = [], 0
    for n in writes:
        out.append(d.compress(data[pos:pos + n]))
        pos += n
    out.append(d.compress(memoryview(data)[pos:]))  # any buffer, like zipfile hands over
    out.append(d.flush())
    return b"".join(out)


_data = st.one_of(st.binary(max_size=5000),
                  st.builds(lambda n, k, seed: np.random.default_rng(seed).integers(0, k, n, dtype=np.uint8).tobytes(),
                            st.integers(0, 200_000), st.sampled_from([2, 4, 256]), st.integers(0, 2**32 - 1)))


@settings(max_examples=60, deadline=None)
@given(data=_data, writes=st.lists(st.integers(0, 70_000), max_size=6),
       block=st.sampled_from([1000, 4096, 65_536, deflate.BLOCK]), isal=st.sampled_from(_libraries))
def test_blocks_on_threads_make_one_stream_of_the_input(data, writes, block, isal):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(inflate, "USE_ISAL", isal)
        with ThreadPoolExecutor(2) as pool:
            threaded = _compressed(data, writes, block, pool)
        inline = _compressed(data, [len(data)], block, None)
    assert threaded == inline  # the threads never change the bytes
    assert zlib.decompress(threaded, -15) == data  # the standard inflater reads it, to the end
    d = zlib.decompressobj(-15)
    assert d.decompress(threaded) == data and d.eof and not d.unused_data


class _CountingPool(ThreadPoolExecutor):
    """A pool that counts its jobs and has each done before it is handed back (the fastest pool: a
    deflater that judged a stream by the jobs still in flight took one of several blocks whose others were
    done and collected for a stream of one block; CI saw it once)."""

    def __init__(self):
        super().__init__(2)
        self.jobs = 0

    def submit(self, *args, **kwargs):
        self.jobs += 1
        job = super().submit(*args, **kwargs)
        job.result()
        return job


@pytest.mark.parametrize("size, block, handed", [(0, 1000, 0), (200, 1000, 0), (deflate.INLINE_BYTES - 1, 1 << 20, 0),
                                                 (deflate.INLINE_BYTES, 1 << 20, 1), (2500, 1000, 3)])
def test_a_stream_of_one_short_block_is_compressed_by_the_writers_thread(size, block, handed):
    """A stream of one block shorter than INLINE_BYTES (a small member) is compressed in the writer's
    thread, not handed to the pool and waited for; longer streams, and streams of several blocks (each
    block to the pool, the last too), are handed over. The same bytes either way."""
    data = np.random.default_rng(size).integers(0, 4, size, dtype=np.uint8).tobytes()
    with _CountingPool() as pool:
        threaded = _compressed(data, [], block, pool)
    assert pool.jobs == handed and threaded == _compressed(data, [], block, None)
    assert zlib.decompress(threaded, -15) == data


def test_levels_and_history_across_blocks():
    """A block that repeats the one before it compresses to almost nothing (the dictionary carries the
    history across the cut, as one stream would), and an explicit zlib level is used as given."""
    data = bytes(np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8)) * 8
    with pytest.MonkeyPatch.context() as m:
        m.setattr(inflate, "USE_ISAL", False)
        primed = _compressed(data, [], 20_000, None, level=6)
        stored = _compressed(data, [], 20_000, None, level=0)
    plain = b"".join(deflate.deflate_block(zlib, 6, data[i:i + 20_000], b"", i + 20_000 >= len(data))
                     for i in range(0, len(data), 20_000))  # the same blocks without their history
    assert zlib.decompress(primed, -15) == zlib.decompress(plain, -15) == zlib.decompress(stored, -15) == data
    assert len(primed) < 25_000 and len(plain) > len(data) and len(stored) > len(data)


@pytest.mark.parametrize("isal", _libraries)
def test_compressed_npz_members_are_deflated_on_threads_and_read_everywhere(tmp_path, monkeypatch, isal):
    monkeypatch.setattr(inflate, "USE_ISAL", isal)
    made = []
    real = deflate.ParallelDeflater
    monkeypatch.setattr(deflate, "ParallelDeflater", lambda *a, **k: made.append(1) or real(*a, **k))
    monkeypatch.setattr(deflate, "BLOCK", 4096)  # many blocks per member
    rng = np.random.default_rng(1)
    t = {"w": rng.standard_normal((300, 70)).astype(np.float32), "b": np.arange(5.0), "e": np.zeros(0, np.int8),
         "big": np.repeat(rng.standard_normal(1000), 50)}
    p = str(tmp_path / "c.npz")
    save_dump(p, t, {"step": 7}, compress=True)
    assert len(made) == len(t)  # every tensor member went through the parallel deflater
    monkeypatch.setattr(zipfile, "crc32", zlib.crc32)
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None  # zlib inflates every member and checks its CRC-32
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
    with np.load(p) as npz:
        assert all(np.array_equal(npz[k], v) for k, v in t.items())
    with open_dump(p) as r:
        assert r.compressed and r.step == 7 and all(np.array_equal(r.read(k), v) for k, v in t.items())


_shapes = st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple)


@settings(max_examples=25, deadline=None)
@given(shape=_shapes, dtype=st.sampled_from(["<f4", ">f4", "<f8", "<f2", "<i8", "|b1"]),
       step=st.integers(1, 5000), seed=st.integers(0, 2**32 - 1), isal=st.sampled_from(_libraries),
       chunk_rows=st.integers(1, 7), whole=st.booleans())
def test_gzip_hdf5_datasets_written_chunk_by_chunk_read_back_exactly(tmp_path_factory, shape, dtype, step, seed,
                                                                      isal, chunk_rows, whole):
    """A gzip tensor streamed in chunks of any length is cut into HDF5 chunks (edge chunks padded),
    compressed on threads and written directly, gathered whole first (a small dataset) or a band of
    chunk rows at a time: h5py reads the same values, the dataset keeps gzip, its level and the chunk
    shape; a short stream is an error."""
    import h5py

    from gradtool.io import hdf5
    from gradtool.io.base import TensorInfo
    from gradtool.io.hdf5 import Hdf5Writer

    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 10).astype(dtype)
    p = str(tmp_path_factory.mktemp("h5") / "g.h5")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(inflate, "USE_ISAL", isal)
        m.setattr(hdf5, "_guessed_chunks", _with_chunk_rows(chunk_rows))
        m.setattr(hdf5, "SMALL_DATASET_BYTES", 1 << 20 if whole else -1)
        compressed = []
        m.setattr(deflate, "compress_chunk", lambda d, lv, real=deflate.compress_chunk: compressed.append(lv) or real(d, lv))
        w = Hdf5Writer(p, {"step": 1})
        flat = a.reshape(-1).astype(a.dtype.newbyteorder("="))
        w.add_chunks(TensorInfo("g/t", shape, a.dtype, compression="gzip", compression_opts=6),
                     (flat[i:i + step] for i in range(0, flat.size, step)))
        with pytest.raises(RuntimeError, match="rows|elements"):
            w.add_chunks(TensorInfo("short", shape, a.dtype, compression="gzip", compression_opts=6),
                         iter([flat[: flat.size - 1]]) if flat.size > 1 else iter([flat[:0]]))
        w.close()
    assert compressed and set(compressed) == {6}  # the direct path wrote it, at the dataset's level
    with h5py.File(p) as f:
        ds = f["g/t"]
        assert ds.compression == "gzip" and ds.compression_opts == 6 and ds.chunks[0] == min(chunk_rows, shape[0])
        assert ds.dtype == a.dtype.newbyteorder("=") and np.array_equal(ds[...], a)


def _with_chunk_rows(rows):
    """The writer's chunk shape with the first dimension forced to ``rows`` (h5py's guess keeps it whole
    for small tensors), so that bands and edge chunks happen in small examples."""
    def chunks(shape, itemsize):
        return (min(rows, shape[0]),) + tuple(max(1, (n + 1) // 2) for n in shape[1:])
    return chunks


@pytest.mark.parametrize("shape, chunk_rows, handed", [((5, 3), 8, 0), ((1,), 8, 0), ((6, 3), 2, 0),
                                                       ((40_000,), 40_000, 1), ((40_000, 2), 10_000, 4)])
def test_a_small_gzip_dataset_is_compressed_by_the_writers_thread(tmp_path, monkeypatch, shape, chunk_rows,
                                                                  handed):
    """A gzip dataset under INLINE_BYTES is compressed by the writer's thread, in one chunk or several;
    a larger one hands its chunks to the writer's pool. h5py reads them back."""
    import h5py

    from gradtool.io import hdf5
    from gradtool.io.base import TensorInfo
    from gradtool.io.hdf5 import Hdf5Writer

    pools = []
    monkeypatch.setattr(deflate, "thread_pool", lambda: pools.append(_CountingPool()) or pools[-1])
    monkeypatch.setattr(hdf5, "_guessed_chunks",
                        lambda shape, itemsize: (min(chunk_rows, shape[0]),) + shape[1:])
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    p = str(tmp_path / "g.h5")
    w = Hdf5Writer(p, {"step": 1})
    w.add_chunks(TensorInfo("t", shape, a.dtype, compression="gzip", compression_opts=4), iter([a.reshape(-1)]))
    w.close()
    assert sum(pool.jobs for pool in pools) == handed
    with h5py.File(p) as f:
        assert f["t"].compression == "gzip" and np.array_equal(f["t"][...], a)


def test_gzip_datasets_made_low_level_are_h5py_s_byte_for_byte(tmp_path, monkeypatch):
    """The writer creates its gzip datasets with h5py's low-level h5d.create (~100 us a dataset less
    than group.create_dataset) and h5py's chunk guess, with one creation property list a level whose
    chunk shape is set as it changes (one a chunk shape held ~13 MB for 20,000 datasets of 1-5 k
    elements): the file is the one group.create_dataset(..., compression="gzip") makes, byte for byte:
    names ASCII and not, nested groups, dtypes, shapes (one chunk and several; at one level, a shape,
    another, the first again), levels (none given: h5py's 4), attributes."""
    import h5py

    from gradtool.io.base import TensorInfo
    from gradtool.io.hdf5 import Hdf5Writer

    rng = np.random.default_rng(4)
    tensors = [("a/w", rng.standard_normal((300, 400)).astype(np.float32), 4, {}),
               ("a/é", np.ones(5, np.float16), 9, {"unit": "x"}),
               ("b", np.arange(7, dtype=np.int64), None, {}),
               ("c/d/e", rng.standard_normal((3, 4, 5)), 1, {}),
               ("a/w2", rng.standard_normal((300, 400)), 4, {}),
               ("m", np.array([True, False]), 0, {})]

    def write(path):
        w = Hdf5Writer(path, {"step": 3})
        for name, a, level, attrs in tensors:
            info = TensorInfo(name, a.shape, a.dtype, attrs=attrs, compression="gzip", compression_opts=level)
            w.add_chunks(info, iter([a.reshape(-1)]))
        w.close()
        return w

    low = write(str(tmp_path / "low.h5"))
    assert sorted(low._gzip_dcpls) == [0, 1, 4, 9]  # (one list a level, not a chunk shape)

    def high_level(self, group, leaf, shape, dtype, level):
        ds = group.create_dataset(leaf, shape=shape, dtype=dtype, compression="gzip", compression_opts=level)
        return ds.id, ds.chunks

    monkeypatch.setattr(Hdf5Writer, "_gzip_dataset", high_level)
    write(str(tmp_path / "high.h5"))
    assert (tmp_path / "low.h5").read_bytes() == (tmp_path / "high.h5").read_bytes()
    with h5py.File(tmp_path / "low.h5") as f:
        for name, a, level, attrs in tensors:
            assert f[name].compression == "gzip"
            assert f[name].compression_opts == (4 if level is None else level)
            assert np.array_equal(f[name][...], a) and dict(f[name].attrs) == attrs


@pytest.mark.parametrize("level", [67108873, -1, 10, True, 2.0, None])
def test_a_gzip_level_neither_h5py_nor_hdf5_would_set_is_written_at_h5pys_default(tmp_path, level):
    """A gzip dataset's level comes from its filter's parameters, which a damaged or foreign file may
    hold out of 0-9 (HDF5 reads such a dataset; the fuzzer found clip of one raised h5py's ValueError):
    its tensor is written, streamed (add_chunks) or whole (add), gzip at h5py's default 4, its data
    unchanged."""
    import h5py

    from gradtool.io.base import TensorInfo
    from gradtool.io.hdf5 import Hdf5Writer

    a = np.random.default_rng(1).standard_normal((30, 7)).astype(np.float32)
    p = str(tmp_path / "g.h5")
    w = Hdf5Writer(p, {"step": 1})
    w.add_chunks(TensorInfo("streamed", a.shape, a.dtype, compression="gzip", compression_opts=level),
                 iter([a.reshape(-1)]))
    w.add(TensorInfo("whole", a.shape, a.dtype, compression="gzip", compression_opts=level), a)
    w.close()
    with h5py.File(p) as f:
        for name in ("streamed", "whole"):
            assert f[name].compression == "gzip" and f[name].compression_opts == 4
            assert np.array_equal(f[name][...], a)
