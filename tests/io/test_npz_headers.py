"""The .npy headers of a deflated npz's members (np.savez_compressed) are read from the bytes read with each
member's local header, inflated there (gradtool/io/npz.py ``_deflated_head``), not through zipfile's member
objects: the same index as zipfile's, and zipfile's path (and its errors) where that does not apply."""

import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradtool import open_dump
from gradtool.errors import InputError


def _index(path):
    with open_dump(path) as r:
        return [(i.name, i.shape, i.dtype.str, i.fortran, r._header_lengths[i.name]) for i in r.tensors]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.integers(0, 5), max_size=4),
                          st.sampled_from(["<f4", ">f8", "<f2", "|u1", "<i8", "|b1", "<c8"]), st.booleans()),
                min_size=1, max_size=6))
def test_deflated_headers_give_zipfiles_index(tmp_path, monkeypatch, arrays):
    """Shapes (empty, scalar), dtypes, byte orders and Fortran order: the index read from the inflated
    local bytes is zipfile's, and zipfile opens no member while indexing."""
    tensors = {}
    for k, (shape, dtype, fortran) in enumerate(arrays):
        a = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
        tensors[f"t{k}"] = np.asfortranarray(a) if fortran and a.ndim > 1 else a
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, **tensors)
    fast = _index(p)
    opened = []
    real = zipfile.ZipFile.open
    with monkeypatch.context() as m:
        m.setattr(zipfile.ZipFile, "open", lambda self, *a, **k: opened.append(a[0]) or real(self, *a, **k))
        assert _index(p) == fast
        assert not opened
        m.setattr("gradtool.io.npz.NpzReader._deflated_head", lambda self, zi, name: None)  # zipfile's path
        assert _index(p) == fast
        assert len(opened) == len(tensors)
    with open_dump(p) as r:
        for name, a in tensors.items():
            np.testing.assert_array_equal(r.read(name), a)


def test_a_header_longer_than_the_bytes_read_goes_through_zipfile(tmp_path, monkeypatch):
    """A member whose .npy header inflates from more than the bytes read with its local header (a
    structured dtype of many fields: a long header, poorly compressible names) is read by zipfile,
    which opens it; the others are not."""
    rng = np.random.default_rng(0)
    names = ["".join(chr(c) for c in rng.integers(97, 123, 24)) for _ in range(120)]
    wide = np.zeros(3, dtype=[(n, "<f4") for n in names])
    p = str(tmp_path / "wide.npz")
    np.savez_compressed(p, w=np.ones((2, 3), np.float32), s=wide)
    opened = []
    real = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open", lambda self, *a, **k: opened.append(
        getattr(a[0], "filename", a[0])) or real(self, *a, **k))
    with pytest.raises(InputError, match="'s'"):  # (a structured dtype is no tensor: refused by name)
        open_dump(p)
    assert opened == ["s.npy"]


def test_a_corrupt_start_of_a_deflated_member_is_zipfiles_error(tmp_path):
    """Bytes zlib refuses at a member's start: zipfile reads the header and its error names the member."""
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, w=np.ones((20, 30), np.float32))
    import struct

    with zipfile.ZipFile(p) as z:
        offset = z.getinfo("w.npy").header_offset
    data = bytearray(open(p, "rb").read())
    name_length, extra_length = struct.unpack_from("<HH", data, offset + 26)  # (the local header's own)
    start = offset + 30 + name_length + extra_length
    data[start: start + 4] = b"\xff\xff\xff\xff"
    open(p, "wb").write(bytes(data))
    with pytest.raises(InputError, match=r"c\.npz.*'w\.npy'"):
        open_dump(p)


def test_reading_a_deflated_member_reads_its_local_header_once(tmp_path, monkeypatch):
    """Where a deflated member's stream starts is found while indexing; reading the member (whole, in
    chunks) uses it rather than reading the local header again (a pread a member), and gives its data."""
    from gradtool.io.npz import NpzReader

    big = np.arange(300_000, dtype=np.float32)
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, big=big, small=big[:10])
    calls = []
    real = NpzReader._local_header
    monkeypatch.setattr(NpzReader, "_local_header", lambda self, zi, n: calls.append(zi.filename) or real(self, zi, n))
    with open_dump(p) as r:
        assert sorted(calls) == ["big.npy", "small.npy"]
        np.testing.assert_array_equal(r.read("big"), big)
        np.testing.assert_array_equal(np.concatenate([c.copy() for c in r.iter_chunks(r.tensors[0], 4096)]), big)
        np.testing.assert_array_equal(r.read("small"), big[:10])
    assert sorted(calls) == ["big.npy", "small.npy"]
