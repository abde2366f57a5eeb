"""HDF5 datasets indexed from their object headers (gradtool.io.h5header) give exactly what h5py gives,
the shortcut is taken where it should be, and anything it does not know goes to h5py."""

import os

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import open_dump
from gradtool.io import h5header
from gradtool.io.hdf5 import Hdf5Reader


def _h5py_view(path):
    """Independent reference: every dataset's (name, shape, dtype, data offset) as h5py opens it."""
    out = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out.append((name, obj.shape, obj.dtype.str, obj.id.get_offset(), sorted(obj.attrs)))
        f.visititems(visit)
    return sorted(out)


def _reader_view(path):
    with open_dump(path) as r:
        return sorted((i.name, i.shape, i.dtype.str, r._offsets.get(i.name), sorted(i.attrs))
                      for i in r.tensors)


@pytest.mark.parametrize("code", [dtype.str for _, dtype in h5header.COMMON_TYPES])
def test_common_types_are_the_bytes_hdf5_writes(tmp_path, code):
    """Each type of COMMON_TYPES is recognised in a file h5py writes, with its data offset: the shortcut
    is really taken (a wrong byte in the table would silently send every dataset to h5py)."""
    path = str(tmp_path / "t.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(6).reshape(2, 3).astype(code))
        f.create_dataset("s", data=np.array(3, dtype=code))  # scalar
    with h5py.File(path, "r") as f:
        fd = os.open(path, os.O_RDONLY)
        try:
            for name in ("x", "s"):
                found = h5header.read_contiguous(fd, h5py.h5o.get_info(f.id, name.encode()).addr,
                                                 os.path.getsize(path))
                assert found == (f[name].shape, np.dtype(code), f[name].id.get_offset()), name
        finally:
            os.close(fd)


_dtypes = st.sampled_from(["<f4", ">f4", "<f8", "<f2", "<i8", ">i4", "<i2", "i1", "u1", "<u8", "?", "<c8"])


@st.composite
def _datasets(draw):
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    return {"dtype": draw(_dtypes), "shape": shape,
            "layout": draw(st.sampled_from(["contiguous", "chunked", "gzip", "compact", "fill"])),
            "attrs": draw(st.booleans()), "group": draw(st.sampled_from(["", "g/", "g/h/"]))}


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(_datasets(), min_size=1, max_size=6), track=st.booleans(), libver=st.booleans())
def test_index_equals_h5py_for_every_layout(tmp_path_factory, specs, track, libver):
    """Names, shapes, dtypes and data offsets of the reader's index equal h5py's for contiguous, chunked,
    compressed and compact datasets, with and without attributes, a fill value, creation-order tracking
    and the newest file format (version-2 object headers): whatever the header shortcut takes, it takes
    right, and the rest goes to h5py."""
    path = str(tmp_path_factory.mktemp("h5") / "d.h5")
    with h5py.File(path, "w", track_order=track, libver="latest" if libver else "earliest") as f:
        for i, spec in enumerate(specs):
            data = (np.arange(int(np.prod(spec["shape"]))) % 7).reshape(spec["shape"]).astype(spec["dtype"])
            kw = {}
            if spec["layout"] in ("chunked", "gzip") and data.ndim and data.size:
                kw["chunks"] = True
                if spec["layout"] == "gzip":
                    kw["compression"] = "gzip"
            elif spec["layout"] == "fill":
                kw["fillvalue"] = np.ones((), dtype=data.dtype)
            name = f"{spec['group']}t{i}"
            if spec["layout"] == "compact" and data.nbytes < 60000:
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_layout(h5py.h5d.COMPACT)
                grp = f.require_group(spec["group"]) if spec["group"] else f
                space = h5py.h5s.create_simple(data.shape) if data.ndim else h5py.h5s.create(h5py.h5s.SCALAR)
                dsid = h5py.h5d.create(grp.id, f"t{i}".encode(), h5py.h5t.py_create(data.dtype), space,
                                       dcpl=dcpl)
                if data.size:
                    dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(data))
            else:
                f.create_dataset(name, data=data, **kw)
            if spec["attrs"]:
                f[name].attrs["unit"] = "x"
    assert _reader_view(path) == _h5py_view(path)
    with open_dump(path) as r:
        for info in r.tensors:  # and the bytes at those offsets are the data
            if info.size:  # h5py opens it as gradtool does (HDF5 refuses other locking flags in a process)
                expected = h5py.File(path, "r", locking=False)[info.name][()].reshape(-1)
                got = np.concatenate([c.copy() for c in r.iter_chunks(info, 5)])
                np.testing.assert_array_equal(got, expected)


def test_the_shortcut_is_taken_for_a_plain_dump(tmp_path, monkeypatch):
    """A dump gradtool writes is indexed without opening its datasets (the point of the module)."""
    from gradtool import save_dump

    path = str(tmp_path / "d.h5")
    save_dump(path, {f"layer{i}/w": np.ones((4, 3), np.float32) for i in range(5)})
    opened = []
    real = h5py.h5d.open
    monkeypatch.setattr(h5py.h5d, "open", lambda *a, **k: opened.append(a[1]) or real(*a, **k))
    with open_dump(path) as r:
        assert len(r.tensors) == 5
    assert len(opened) == 1  # the first one only, checked against h5py


def test_a_file_where_the_header_disagrees_with_h5py_is_read_by_h5py(tmp_path, monkeypatch):
    """If the first dataset read from its header differs from what h5py says, no dataset of that file is
    taken from its header."""
    from gradtool import save_dump

    path = str(tmp_path / "d.h5")
    save_dump(path, {f"t{i}": np.full(10, i, np.float32) for i in range(4)})
    real = h5header.read_dataset
    calls = []

    def off_by_four(fd, address, size):
        calls.append(address)
        found = real(fd, address, size)
        return None if found is None else found._replace(offset=found.offset + 4)

    monkeypatch.setattr(h5header, "read_dataset", off_by_four)
    assert _reader_view(path) == _h5py_view(path)
    with open_dump(path) as r:
        assert [float(next(r.iter_chunks(i, 10))[0]) for i in r.tensors] == [0.0, 1.0, 2.0, 3.0]
    assert calls  # (the shortcut was asked, and its answer refused)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=600), seed=st.integers(0, 2**32 - 1))
def test_parse_header_never_raises_and_stays_consistent(data, seed):
    """Any bytes (random, or a real header with bytes flipped): None, or a shape and dtype whose size is
    what the layout message claims; never an exception."""
    rng = np.random.default_rng(seed)
    real = bytearray(_REAL_HEADER)
    for _ in range(int(rng.integers(0, 4))):
        real[int(rng.integers(0, len(real)))] ^= 1 << int(rng.integers(0, 8))
    gzip = bytearray(_REAL_GZIP_HEADER)
    for _ in range(int(rng.integers(0, 4))):
        gzip[int(rng.integers(0, len(gzip)))] ^= 1 << int(rng.integers(0, 8))
    for head in (data, bytes(real), bytes(gzip)):
        found = h5header.parse_header(head)
        if isinstance(found, h5header.Contiguous):
            shape, dtype, address = found
            assert all(d >= 0 for d in shape) and address >= 0
        elif found is not None:
            assert isinstance(found, h5header.Deflated) and found.chunks is None
            assert len(found.chunk) == len(found.shape) and all(c > 0 for c in found.chunk)
            assert all(d > 0 for d in found.shape) and found.tree >= 0 and found.level >= 0
            shape, dtype = found.shape, found.dtype
        if found is not None:
            assert dtype in {d for _, d in h5header.COMMON_TYPES}


def _real_header(**kw):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=np.zeros((5, 7), np.float32), **kw)
        with h5py.File(path, "r") as f:
            addr = h5py.h5o.get_info(f.id, b"x").addr
        with open(path, "rb") as f:
            f.seek(addr)
            return f.read(512)


_REAL_HEADER = _real_header()
_REAL_GZIP_HEADER = _real_header(compression="gzip", shuffle=True, chunks=(2, 7))


def test_truncated_data_is_still_reported(tmp_path):
    """A dataset whose data would run past the end of the file: the header shortcut declines it and the
    reader reports the file as truncated, as before."""
    from gradtool import save_dump
    from gradtool.errors import InputError
    from gradtool.summarize import summarize_dump

    path = str(tmp_path / "d.h5")
    save_dump(path, {"a": np.ones(1000, np.float32), "b": np.ones(100_000, np.float32)})
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 1000)
    with pytest.raises(InputError, match="d.h5"):
        with Hdf5Reader(path) as r:
            summarize_dump(r)


def _gzip_dump(path, n=6, **kw):
    rng = np.random.default_rng(3)
    want = {}
    with h5py.File(path, "w") as f:
        for i in range(n):
            a = (rng.standard_normal((i + 1, 300 * (i + 1))) * 10).astype(np.float32)
            f.create_dataset(f"g/t{i}", data=a, compression="gzip", **kw)
            want[f"g/t{i}"] = a
    return want


@pytest.mark.parametrize("kw", [{}, {"shuffle": True}, {"compression_opts": 9}, {"chunks": (1, 300)}])
def test_gzip_datasets_are_read_from_their_headers_without_opening_them(tmp_path, monkeypatch, kw):
    """A gzip dump (h5py's own chunking: one chunk, or several) is indexed without opening its datasets
    but the first, checked against h5py; each dataset reads as h5py reads it, from its chunks' bytes,
    and keeps its compression and level (clip writes them back)."""
    path = str(tmp_path / "gz.h5")
    want = _gzip_dump(path, **kw)
    opened = []
    real = h5py.h5d.open
    monkeypatch.setattr(h5py.h5d, "open", lambda *a, **k: opened.append(a[1]) or real(*a, **k))
    with open_dump(path) as r:
        assert sorted(r._deflated) == sorted(want)
        assert len(opened) == 1  # the first one only, checked against h5py
        for info in r.tensors:
            assert (info.compression, info.compression_opts) == ("gzip", kw.get("compression_opts", 4))
            np.testing.assert_array_equal(r.read(info.name), want[info.name])
            got = np.concatenate([c.copy() for c in r.iter_chunks(info, 1 << 16)])
            np.testing.assert_array_equal(got, want[info.name].reshape(-1))
    assert len(opened) == 1  # and read without opening them


def test_a_gzip_file_where_the_header_disagrees_with_h5py_is_read_by_h5py(tmp_path, monkeypatch):
    """If the first gzip dataset read from its header differs from what h5py says of it, no dataset of
    that file is taken from its header."""
    path = str(tmp_path / "gz.h5")
    want = _gzip_dump(path, shuffle=True)
    real = h5header.read_dataset

    def unshuffled(fd, address, size):
        found = real(fd, address, size)
        return found._replace(shuffle=False) if isinstance(found, h5header.Deflated) else found

    monkeypatch.setattr(h5header, "read_dataset", unshuffled)
    with open_dump(path) as r:
        assert not r._deflated and not r.compressed
        for info in r.tensors:
            np.testing.assert_array_equal(r.read(info.name), want[info.name])


def test_gzip_datasets_it_does_not_know_go_to_h5py(tmp_path):
    """Other filters, attributes, a chunk never written (the fill value), more chunks than one B-tree
    leaf holds, chunks larger than the dataset (resized smaller), a fill value of its own: opened by h5py,
    read as h5py reads them; a dataset grown by resizing, every chunk written, is read from its header."""
    path = str(tmp_path / "other.h5")
    a = np.arange(4000, dtype=np.float32).reshape(40, 100)
    with h5py.File(path, "w") as f:
        f.create_dataset("fletcher", data=a, compression="gzip", fletcher32=True)
        f.create_dataset("lzf", data=a, compression="lzf")
        f.create_dataset("attrs", data=a, compression="gzip").attrs["unit"] = "x"
        f.create_dataset("many", data=a, chunks=(1, 50), compression="gzip")  # 80 chunks: two leaves
        f.create_dataset("sparse", shape=(40, 100), dtype="f4", chunks=(10, 100), compression="gzip",
                         fillvalue=7.0)[0:10] = 1.0
        f.create_dataset("ok", data=a, compression="gzip")
        grown = f.create_dataset("grown", data=a[:, :10], maxshape=(None, None), compression="gzip")
        grown.resize((80, 10))
        grown[40:] = a[:, :10]
        shrunk = f.create_dataset("shrunk", data=a, chunks=(40, 100), maxshape=(None, None),
                                  compression="gzip")
        shrunk.resize((10, 100))  # a chunk larger than the dataset
        f.create_dataset("filled", data=a, compression="gzip", fillvalue=7.0)  # another fill value
    with open_dump(path) as r:
        assert sorted(r._deflated) == ["grown", "ok"]
        for name in ("fletcher", "lzf", "attrs", "many", "ok", "filled"):
            np.testing.assert_array_equal(r.read(name), a)
        assert r.read("sparse")[20, 0] == 7.0
        np.testing.assert_array_equal(r.read("grown"), np.concatenate([a[:, :10], a[:, :10]]))
        np.testing.assert_array_equal(r.read("shrunk"), a[:10])


@pytest.mark.parametrize("damage", ["corrupt", "bomb", "truncated"])
def test_a_bad_gzip_chunk_is_a_one_line_error(tmp_path, damage, run):
    """A chunk whose bytes are corrupt, that inflates to more than its elements (never held whole: at
    most its size + 1 bytes are made), or that the file ends within: a one-line error naming the file
    and the dataset, exit 1."""
    import zlib

    path = str(tmp_path / "gz.h5")
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=rng.standard_normal(5000).astype(np.float32), compression="gzip")
        f.create_dataset("y", data=rng.standard_normal(5000).astype(np.float32), compression="gzip")
    with h5py.File(path, "r") as f:
        info = f["y"].id.get_chunk_info(0)
    data = bytearray(open(path, "rb").read())
    if damage == "corrupt":
        data[info.byte_offset + info.size // 2: info.byte_offset + info.size // 2 + 8] = b"\xff" * 8
    elif damage == "bomb":  # a stream within the stored size that inflates to 20,008 bytes, not 20,000
        bomb = zlib.compress(b"\0" * 20008, 9)
        assert len(bomb) <= info.size
        data[info.byte_offset: info.byte_offset + len(bomb)] = bomb
    else:
        data = data[: info.byte_offset + info.size // 2]
    open(path, "wb").write(bytes(data))
    try:
        with open_dump(path) as r:
            assert "y" in r._deflated or damage == "truncated"
    except Exception:
        pass
    r = run("stats", path, "--format", "json")
    assert r.exit_code == 1 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "gz.h5" in r.stderr
    if damage != "truncated":
        assert "'y'" in r.stderr and ("corrupt" in r.stderr or "does not inflate" in r.stderr)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=200), entries=st.integers(0, 70), rank=st.integers(1, 3))
def test_parse_chunk_leaf_never_raises(data, entries, rank):
    """Any bytes after a leaf's signature: None, or as many distinct chunks as the grid has."""
    import struct

    shape, chunk = (5,) * rank, (2,) * rank
    node = b"TREE\x01\x00" + struct.pack("<H", entries) + b"\xff" * 16 + data
    found = h5header.parse_chunk_leaf(node, shape, chunk)
    assert found is None or (len(found) == 3 ** rank and all(s > 0 for _, s in found.values()))


def test_a_gzip_dataset_claiming_more_than_memory_is_refused(tmp_path, monkeypatch, run):
    """A gzip dataset read from its header is inflated whole: one whose shape claims more bytes than the
    machine's memory is refused, as other readers refuse such a tensor, with a one-line error."""
    from gradtool.io import base, hdf5

    path = str(tmp_path / "gz.h5")
    _gzip_dump(path, n=2)
    monkeypatch.setattr(hdf5, "physical_memory", lambda: 1000)
    assert base.physical_memory() > 1000  # (only the gzip reader's check is made small)
    r = run("stats", path, "--format", "json")
    assert r.exit_code != 0 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "more than this machine's memory" in r.stderr and "gz.h5" in r.stderr


def _leaf(rank, entries):
    """The bytes of a version-1 B-tree leaf of raw-data chunks: (stored size, filter mask, offsets,
    address) a chunk, then the end key."""
    import struct

    key = lambda size, mask, offsets: struct.pack(f"<II{rank + 1}Q", size, mask, *offsets, 0)  # noqa: E731
    body = b"".join(key(size, mask, offsets) + struct.pack("<Q", address)
                    for size, mask, offsets, address in entries)
    undefined = (1 << 64) - 1
    return (b"TREE\x01\x00" + struct.pack("<HQQ", len(entries), undefined, undefined) + body
            + key(0, 0, (0,) * rank))


def test_parse_chunk_leaf_takes_only_a_whole_grid_of_chunks():
    """A leaf's chunks by their place in the grid; None for a chunk off the grid (an offset that is no
    multiple of the chunk, or past the dataset), a repeated place, a filter skipped, an empty chunk, or
    fewer chunks than the grid has."""
    good = [(10, 0, (0, 0), 1000), (12, 0, (0, 4), 2000), (9, 0, (3, 0), 3000), (11, 0, (3, 4), 4000)]
    assert h5header.parse_chunk_leaf(_leaf(2, good), (5, 6), (3, 4)) == {
        (0, 0): (1000, 10), (0, 1): (2000, 12), (1, 0): (3000, 9), (1, 1): (4000, 11)}
    for bad in ([(10, 0, (0, 0), 1000), (12, 0, (0, 3), 2000), *good[2:]],  # off the grid
                [(10, 0, (0, 0), 1000), (12, 0, (0, 8), 2000), *good[2:]],  # past the dataset
                [good[0], good[0], *good[2:]],  # a place twice
                [good[0], (12, 1, (0, 4), 2000), *good[2:]],  # a filter skipped
                [good[0], (0, 0, (0, 4), 2000), *good[2:]],  # nothing stored
                good[:3]):  # a chunk missing
        assert h5header.parse_chunk_leaf(_leaf(2, bad), (5, 6), (3, 4)) is None


def test_the_metadata_cache_is_capped_and_every_dataset_still_reads(tmp_path):
    """HDF5's metadata cache may grow to 32 MB of images (~10x that decoded): a reader caps it at
    METADATA_CACHE_BYTES, and a file of more datasets than that holds (each of the three kinds: from
    its header, gzip from its header, h5py's with attributes) still gives every value."""
    from gradtool.io import hdf5

    path = str(tmp_path / "many.h5")
    rng = np.random.default_rng(3)
    want = {}
    with h5py.File(path, "w") as f:
        for i in range(600):
            a = rng.standard_normal(int(rng.integers(1, 50))).astype(np.float32)
            want[f"t{i:03d}"] = a
            ds = f.create_dataset(f"t{i:03d}", data=a, **({"compression": "gzip"} if i % 3 == 1 else {}))
            if i % 3 == 2:
                ds.attrs["note"] = i
    with open_dump(path) as r:
        assert {t.name: r.read(t.name).tolist() for t in r.tensors} == {k: v.tolist() for k, v in want.items()}
        assert r._f.id.get_mdc_config().max_size == hdf5.METADATA_CACHE_BYTES
        assert r._f.id.get_mdc_size()[0] <= hdf5.METADATA_CACHE_BYTES  # (max size, ...) as HDF5 has it now
    with h5py.File(path, "r") as held:  # open in this process with the lock: its opener's settings stay
        default = held.id.get_mdc_config().max_size
        with open_dump(path) as r:
            assert r.read("t000").tolist() == want["t000"].tolist()
        assert held.id.get_mdc_config().max_size == default > hdf5.METADATA_CACHE_BYTES


def test_a_written_file_s_metadata_cache_is_capped_and_it_reads_back_whole(tmp_path):
    """The writer caps its own file's metadata cache too (each object is written once), and a file of
    more datasets than that holds, some gzip, reads back as written."""
    from gradtool.io import hdf5
    from gradtool.io.base import TensorInfo

    path = str(tmp_path / "w.h5")
    rng = np.random.default_rng(4)
    want = {f"g/t{i:03d}": rng.standard_normal(int(rng.integers(1, 40))).astype(np.float32) for i in range(600)}
    w = hdf5.Hdf5Writer(path)
    assert w._f.id.get_mdc_config().max_size == hdf5.METADATA_CACHE_BYTES
    for i, (name, a) in enumerate(want.items()):
        w.add(TensorInfo(name, a.shape, a.dtype, compression="gzip" if i % 2 else None), a)
    assert w._f.id.get_mdc_size()[0] <= hdf5.METADATA_CACHE_BYTES
    w.close()
    with h5py.File(path, "r") as f:
        assert {n: f[n][()].tolist() for n in want} == {n: a.tolist() for n, a in want.items()}
        assert f["g/t001"].compression == "gzip" and f["g/t000"].compression is None


def test_shapes_and_chunk_places_are_shared_up_to_a_bound(tmp_path, monkeypatch):
    """Equal shapes, chunk shapes and chunk places of an index are one tuple (``h5header.shared``), and
    no more than SHARED_TUPLES are kept: past it a tuple is given back as it is, still equal."""
    monkeypatch.setattr(h5header, "_SHARED", {})
    path = str(tmp_path / "g.h5")
    with h5py.File(path, "w") as f:
        for i in range(6):
            f.create_dataset(f"t{i}", data=np.ones((40, 3), np.float32), compression="gzip", chunks=(16, 3))
    with open_dump(path) as r:
        plans = [r._deflated[i.name] for i in r.tensors]
        assert all(p.shape == (40, 3) and p.chunk == (16, 3) for p in plans)
        assert len({id(p.shape) for p in plans}) == 1 and len({id(p.chunk) for p in plans}) == 1
        assert {id(k) for p in plans for k in p.chunks if k == (2, 0)} == {id(h5header.shared((2, 0)))}
        assert r.tensors[0].shape is plans[0].shape
    monkeypatch.setattr(h5header, "SHARED_TUPLES", len(h5header._SHARED))
    new = tuple([7, 7, 7])
    assert h5header.shared(new) is new and h5header.shared(tuple([7, 7, 7])) is not new
    assert (7, 7, 7) not in h5header._SHARED and h5header.shared((40, 3)) == (40, 3)


def test_a_dataset_of_one_chunk_has_its_chunk_as_a_one_entry_mapping(tmp_path):
    """A one-chunk dataset's plan keeps its chunk in a :class:`OneChunk` (no dict a dataset), which acts
    as the one-entry dict it replaces; a dataset of several chunks keeps its dict."""
    from gradtool.io.h5inflate import OneChunk, compact_chunks

    path = str(tmp_path / "g.h5")
    a, b = np.arange(10, dtype=np.float32), np.arange(40, dtype=np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("one", data=a, compression="gzip")
        f.create_dataset("four", data=b, compression="gzip", chunks=(10,))
    with h5py.File(path) as f:
        info = f["one"].id.get_chunk_info(0)
    with open_dump(path) as r:
        one, four = r._deflated["one"], r._deflated["four"]
        assert isinstance(one.chunks, OneChunk) and type(four.chunks) is dict and len(four.chunks) == 4
        assert dict(one.chunks) == {(0,): (info.byte_offset, info.size)} == one.chunks
        assert (r.read("one") == a).all() and (r.read("four") == b).all()
    m = compact_chunks({(0, 0): (4096, 77)})
    assert len(m) == 1 and list(m) == [(0, 0)] and m[(0, 0)] == (4096, 77) and (0, 0) in m
    assert m.get((1, 0)) is None and (1, 0) not in m and list(m.items()) == [((0, 0), (4096, 77))]
    with pytest.raises(KeyError):
        m[(0, 1)]
    assert compact_chunks({}) == {} and len(compact_chunks({(0,): (1, 2), (1,): (3, 4)})) == 2


@settings(max_examples=200, deadline=None)
@given(bodies=st.lists(st.binary(max_size=40), min_size=1, max_size=8), itemsize=st.sampled_from([1, 2, 4, 8]))
def test_message_parses_kept_for_reuse_give_what_parsing_again_gives(bodies, itemsize):
    """The dataspace, datatype and filter messages are parsed once each and the result kept (a dump's
    datasets repeat a few; at most PARSED_BODIES of each): the same answers as parsing them afresh, asked
    twice, for any bytes."""
    for body in bodies + bodies:
        assert h5header.parse_dataspace(body) == h5header.parse_dataspace.__wrapped__(body)
        assert h5header.parse_datatype(body) == h5header.parse_datatype.__wrapped__(body)
        assert h5header.parse_filters(body, itemsize) == h5header.parse_filters.__wrapped__(body, itemsize)
    for parse in (h5header.parse_dataspace, h5header.parse_datatype, h5header.parse_filters):
        assert parse.cache_info().maxsize == h5header.PARSED_BODIES
