"""python-isal's zlib (gradtool/io/inflate.py) inflates compressed npz members and gzip HDF5 chunks to
exactly what the standard zlib gives; where isal reports an error, zlib judges the same bytes, so corrupt
files fail the same way with or without the extra."""

import sys
import zlib

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradtool import open_dump
from gradtool.errors import InputError
from gradtool.io import h5inflate, inflate

isal_zlib = pytest.importorskip("isal.isal_zlib", reason="python-isal (gradtool[speedups]) not installed")


@pytest.fixture(params=[True, False], ids=["isal", "zlib"])
def use_isal(request, monkeypatch):
    monkeypatch.setattr(inflate, "USE_ISAL", request.param)
    assert (inflate.fast_zlib() is isal_zlib) == request.param
    return request.param


def _read_all(path):
    with open_dump(path) as r:
        return {n: r.read(n) for n in r.names}


_arrays = st.lists(st.tuples(st.sampled_from(["<f4", ">f8", "<f2", "<i8", "u1"]), st.integers(0, 30_000),
                             st.integers(0, 2**32 - 1)), min_size=1, max_size=4)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays=_arrays)
def test_compressed_npz_members_equal_numpy_with_either_library(tmp_path, arrays):
    """Members of any size (empty included), inflated in many 4 KiB pieces (the piece size is lowered so
    the streaming logic runs), give np.load's bytes, by isal and by zlib."""
    t = {f"t{i}": (np.random.default_rng(seed).standard_normal(n) * 50).astype(dt)
         for i, (dt, n, seed) in enumerate(arrays)}
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, **t)
    with pytest.MonkeyPatch.context() as m:
        from gradtool.io.npz import NpzReader

        m.setattr(NpzReader, "INFLATE_PIECE", 4096)
        for flag in (True, False):
            m.setattr(inflate, "USE_ISAL", flag)
            got = _read_all(p)
            for k, a in t.items():
                assert got[k].dtype == a.dtype.newbyteorder("=")
                assert got[k].tobytes() == a.astype(got[k].dtype).tobytes()


def test_gzip_hdf5_chunks_equal_h5py_with_either_library(tmp_path, use_isal):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((500, 70)).astype(np.float32)
    p = str(tmp_path / "gz.h5")
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=a, chunks=(50, 70), compression="gzip", shuffle=True)
    with open_dump(p) as r:
        assert h5inflate.deflate_plan(r._dataset("x").id, a.shape, 4) is not None  # the threaded path
        blocks = [c.copy() for c in r.iter_chunks(r.info("x"), 4096)]
    assert np.concatenate(blocks).reshape(a.shape).tobytes() == a.tobytes()


def test_corrupt_npz_member_fails_the_same_way_with_either_library(tmp_path, use_isal):
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, a=np.random.default_rng(0).standard_normal(10_000))
    data = bytearray(open(p, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(p, "wb").write(bytes(data))
    with pytest.raises(InputError, match=r"c.npz: member 'a.npy' is corrupt \((Error -3|size or CRC)"):
        _read_all(p)


def test_isal_errors_are_judged_by_zlib(monkeypatch):
    """decompress: isal's error sends the bytes to zlib, whose result (or error) stands."""
    good = zlib.compress(b"gradients" * 1000)

    class Refusing:
        error = type("IsalError", (Exception,), {})

        def decompress(self, data, wbits):
            raise self.error("isal says no")

    monkeypatch.setattr(inflate, "fast_zlib", lambda: Refusing())
    assert inflate.decompress(good) == b"gradients" * 1000
    with pytest.raises(zlib.error, match="incorrect header check"):
        inflate.decompress(b"not a zlib stream")


def test_without_isal_the_standard_zlib_is_used(monkeypatch):
    monkeypatch.setitem(sys.modules, "isal", None)  # import fails
    assert inflate.fast_zlib() is zlib
    assert inflate.decompress(zlib.compress(b"x" * 10)) == b"x" * 10


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000), start=st.integers(0, 2**32 - 1))
def test_isal_crc32_is_zlibs(data, start):
    assert isal_zlib.crc32(data, start) == zlib.crc32(data, start)


def test_npz_written_with_isal_crc_passes_zlibs_check(tmp_path, use_isal, monkeypatch):
    """The npz writer lets zipfile take CRC-32 from isal (when on); the members' CRCs, checked again with
    zlib's crc32, are right, and switching isal off puts zlib's back."""
    import zipfile

    from gradtool import save_dump

    monkeypatch.setattr(zipfile, "crc32", zipfile.crc32)  # whatever this test sets is undone after it

    p = str(tmp_path / "d.npz")
    t = {"w": np.random.default_rng(0).standard_normal((300, 70)).astype(np.float32), "b": np.arange(5.0)}
    save_dump(p, t)
    assert zipfile.crc32 is (isal_zlib.crc32 if use_isal else zlib.crc32)
    zipfile.crc32 = zlib.crc32
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None  # every member's CRC-32 recomputed by zlib matches the stored one
    got = _read_all(p)
    assert all(got[k].tobytes() == v.tobytes() for k, v in t.items())
