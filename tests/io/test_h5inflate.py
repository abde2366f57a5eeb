"""gzip HDF5 chunks inflated on worker threads (gradtool/io/h5inflate.py) give exactly the blocks h5py's
one-core path gives, for any shape, chunking, dtype and shuffle; what it cannot read goes to h5py; bad
bytes are one-line errors."""

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradtool import open_dump
from gradtool.errors import InputError
from gradtool.io import h5inflate
from gradtool.summarize import summarize_dump


def blocks(reader, name, chunk_elements, parallel, whole=False, header=False):
    """The dataset's blocks by the plan's threads (``parallel``) or h5py's row reads; ``whole``: a dataset
    of one block read by one HDF5 read (hdf5.SMALL_DATASET_BYTES), else never; ``header``: the plan the
    reader found from the dataset's header and chunk B-tree (gradtool/io/h5header.py) on two threads,
    or (``whole``) inflated on this one, instead of h5py's."""
    from gradtool.io import hdf5

    reader._plans = {} if parallel else {name: None}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(hdf5, "SMALL_DATASET_BYTES", 1 << 20 if whole else -1)
        if not header:
            m.setattr(reader, "_deflated", {})
        return [c.copy() for c in reader.iter_chunks(reader.info(name), chunk_elements)]


@st.composite
def layouts(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 40)) for _ in range(ndim))
    chunk = tuple(draw(st.integers(1, s)) for s in shape)
    dtype = draw(st.sampled_from(["<f4", ">f4", "<f8", ">f8", "<f2", "<i2", "u1"]))
    return shape, chunk, dtype, draw(st.booleans()), draw(st.integers(1, 3000)), draw(st.integers(0, 2**32 - 1))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layouts())
def test_parallel_inflate_equals_h5py(tmp_path, layout):
    shape, chunk, dtype, shuffle, chunk_elements, seed = layout
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    p = str(tmp_path / "gz.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=a, chunks=chunk, compression="gzip", shuffle=shuffle)
    with open_dump(p) as r:
        plan = h5inflate.deflate_plan(r._dataset("x").id, shape, np.dtype(dtype).itemsize)
        assert (plan is not None) == (np.prod([-(-s // c) for s, c in zip(shape, chunk)]) >= 2)
        chunks = np.prod([-(-s // c) for s, c in zip(shape, chunk)])  # (a B-tree leaf holds 64: HDF5's 2K)
        known = np.dtype(dtype).str in ("<f4", "<f8", "<f2", "<i2", "|u1")  # (COMMON_TYPES)
        assert ("x" in r._deflated) == (known and chunks <= 64)
        fast, slow = blocks(r, "x", chunk_elements, True), blocks(r, "x", chunk_elements, False)
        whole = blocks(r, "x", chunk_elements, True, whole=True)
        ours, ours_whole = (blocks(r, "x", chunk_elements, True, whole=w, header=True) for w in (False, True))
        assert ([b.shape for b in fast] == [b.shape for b in slow] == [b.shape for b in whole]
                == [b.shape for b in ours] == [b.shape for b in ours_whole])
        for x, y, z, u, v in zip(fast, slow, whole, ours, ours_whole):
            assert x.dtype == y.dtype == z.dtype == u.dtype == v.dtype
            assert x.tobytes() == y.tobytes() == z.tobytes() == u.tobytes() == v.tobytes()
        np.testing.assert_array_equal(np.concatenate(fast).reshape(shape), a)


def test_stats_of_a_gzip_dump_are_the_same_bits_on_two_cores(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    p = str(tmp_path / "gz.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("w", data=rng.standard_normal((3000, 300)).astype(np.float32), compression="gzip",
                         chunks=(100, 64))
        f.create_dataset("b", data=rng.standard_normal(30000), compression="gzip", chunks=(999,), shuffle=True)
    with open_dump(p) as r:
        fast = summarize_dump(r)
    monkeypatch.setattr(h5inflate, "deflate_plan", lambda *a: None)
    with open_dump(p) as r:
        slow = summarize_dump(r)
    assert repr(fast.tensors) == repr(slow.tensors)


def test_what_it_cannot_read_goes_to_h5py(tmp_path):
    p = str(tmp_path / "other.h5")
    a = np.arange(4000, dtype=np.float32).reshape(40, 100)
    with h5py.File(p, "w") as f:
        f.create_dataset("fletcher", data=a, chunks=(10, 10), compression="gzip", fletcher32=True)
        f.create_dataset("lzf", data=a, chunks=(10, 10), compression="lzf")
        f.create_dataset("plain_chunks", data=a, chunks=(10, 10))
        f.create_dataset("one_chunk", data=a, chunks=(40, 100), compression="gzip")
        d = f.create_dataset("sparse", shape=(40, 100), dtype="f4", chunks=(10, 100), compression="gzip",
                             fillvalue=7.0)
        d[0:10] = 1.0  # three of four chunks never written: they read as the fill value
    with open_dump(p) as r:
        for name in r.names:
            ds = r._dataset(name)
            assert h5inflate.deflate_plan(ds.id, r.info(name).shape, 4) is None, name
            got = np.concatenate([c.copy() for c in r.iter_chunks(r.info(name), 512)])
            np.testing.assert_array_equal(got, r.read(name).ravel())
        assert r.read("sparse")[20, 0] == 7.0


def _gzip_file(tmp_path):
    p = str(tmp_path / "gz.h5")
    rng = np.random.default_rng(2)
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=rng.standard_normal((400, 100)).astype(np.float32), chunks=(50, 100),
                         compression="gzip")
    with h5py.File(p, "r") as f:
        info = f["x"].id.get_chunk_info(3)
    return p, info.byte_offset, info.size


def test_corrupt_chunk_is_a_one_line_error(tmp_path):
    p, offset, size = _gzip_file(tmp_path)
    with open(p, "r+b") as f:
        f.seek(offset + size // 2)
        f.write(b"\xff" * 16)
    with open_dump(p) as r:
        with pytest.raises(InputError, match="gz.h5.*'x'.*(corrupt|inflates)"):
            for _ in r.iter_chunks(r.info("x"), 4096):
                pass


def test_truncated_file_is_a_one_line_error(tmp_path):
    p, offset, size = _gzip_file(tmp_path)
    with open(p, "rb") as f:
        data = f.read()
    with h5py.File(p, "r") as f:
        last = max(f["x"].id.get_chunk_info(i).byte_offset for i in range(8))
    with open(p, "wb") as f:
        f.write(data[: last + 10])
    try:
        r = open_dump(p)
    except InputError:
        return  # the metadata sits past the data: already refused on open, also fine
    with r, pytest.raises(InputError, match="gz.h5"):
        for _ in r.iter_chunks(r.info("x"), 4096):
            pass


def test_stopping_early_leaves_no_thread_behind(tmp_path):
    import threading

    p, _, _ = _gzip_file(tmp_path)
    with open_dump(p) as r:
        it = r.iter_chunks(r.info("x"), 1000)
        next(it)
        it.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("gradtool-inflate")]


def test_a_reader_keeps_a_few_datasets_open_not_every_one(tmp_path):
    """The datasets of a dump are opened as they are read, and only the last OPEN_DATASETS stay open
    (HDF5 holds ~80 kB for an open filtered dataset: 20,000 gzip datasets kept open took 1.7 GB); each
    reads as h5py reads it, whole (one HDF5 read) or in blocks, compact and chunked ones too."""
    from gradtool.io import hdf5

    p = str(tmp_path / "many.h5")
    rng = np.random.default_rng(1)
    want = {}
    with h5py.File(p, "w") as f:
        for i in range(3 * hdf5.OPEN_DATASETS):
            a = rng.standard_normal((i % 7 + 1, 3)).astype(">f4" if i % 5 == 0 else "<f8")
            kw = [{"compression": "gzip"}, {"chunks": (1, 3)}, {"layout": h5py.h5d.COMPACT}][i % 3]
            if "layout" in kw:
                space = h5py.h5s.create_simple(a.shape)
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_layout(h5py.h5d.COMPACT)
                h5py.h5d.create(f.id, f"g/t{i}".encode() if "g" in f else f"t{i}".encode(),
                                h5py.h5t.py_create(a.dtype), space, dcpl=dcpl).write(
                                    h5py.h5s.ALL, h5py.h5s.ALL, a)
                want[f"g/t{i}" if "g" in f else f"t{i}"] = a
                continue
            f.create_dataset(f"g/t{i}", data=a, **kw)
            want[f"g/t{i}"] = a
    with open_dump(p) as r:
        assert not r._datasets  # none opened by the index
        for elements in (1 << 16, 3):
            for info in r.tensors:
                chunks = [c.copy() for c in r.iter_chunks(info, elements)]
                assert {c.dtype for c in chunks} == {info.dtype}  # (big-endian ones too)
                assert np.concatenate(chunks).tolist() == want[info.name].reshape(-1).tolist()
                assert len(r._datasets) <= hdf5.OPEN_DATASETS


def test_stats_of_a_mixed_dump_read_from_headers_on_two_threads_are_h5py_s(tmp_path):
    """A dump of gzip datasets read from their headers is summarised by inflating them on two threads
    (``compressed``: :func:`~gradtool.summarize._summarize_compressed`), its other datasets (contiguous,
    compact, gzip of more chunks than a B-tree leaf, shuffled, float16, integers, big-endian) read on
    those threads too: the same statistics, bit for bit, as reading every one through h5py on one."""
    rng = np.random.default_rng(5)
    p = str(tmp_path / "mixed.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("big", data=rng.standard_normal((700, 500)).astype(np.float32))
        f.create_dataset("small", data=rng.standard_normal(300).astype(np.float32))
        f.create_dataset("gz", data=rng.standard_normal((40, 700)).astype(np.float32), compression="gzip")
        f.create_dataset("gz_many", data=rng.standard_normal((300, 400)).astype(np.float32), chunks=(3, 400),
                         compression="gzip")
        f.create_dataset("gz_big", data=rng.standard_normal((2000, 300)).astype(np.float32), chunks=(50, 300),
                         compression="gzip")
        f.create_dataset("gz_half", data=rng.standard_normal(3000).astype(np.float16), compression="gzip",
                         shuffle=True)
        f.create_dataset("gz_int", data=rng.integers(-9, 9, 5000).astype(np.int16), compression="gzip")
        f.create_dataset("gz_be", data=rng.standard_normal(999).astype(">f4"), compression="gzip")
        f.create_dataset("gz_nan", data=np.array([1.0, np.nan, -np.inf, 3.0], np.float32), compression="gzip")
        for i in range(300):
            f.create_dataset(f"layer{i}/w", data=rng.standard_normal(i + 1).astype(np.float32),
                             compression="gzip")
    with open_dump(p) as r:
        assert r.compressed and {"gz", "gz_big", "gz_half", "gz_int", "layer7/w"} <= set(r._deflated)
        assert "gz_many" not in r._deflated and "gz_be" not in r._deflated
        fast = summarize_dump(r)
    with open_dump(p) as r:
        r._deflated, r.compressed = {}, False
        slow = summarize_dump(r)
    assert [n for n, _ in fast.tensors] == [n for n, _ in slow.tensors]
    assert repr(fast.tensors) == repr(slow.tensors)
