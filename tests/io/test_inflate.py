"""python-isal's zlib (gradtool/io/inflate.py) inflates compressed npz members and gzip HDF5 chunks to
exactly what the standard zlib gives; where isal reports an error, zlib judges the same bytes, so corrupt
files fail the same way with or without the extra."""

import os
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


def _compiled_crc32():
    """The compiled log reader's crc32, or None (not built, or GRADTOOL_NO_KERNELS)."""
    from gradtool.io.compiled import log_readers

    readers = log_readers()
    return None if readers is None else readers.crc32


def test_fast_crc32_is_isals_then_the_compiled_readers_then_zlibs(monkeypatch):
    monkeypatch.setattr(inflate, "USE_ISAL", True)
    assert inflate.fast_crc32() is isal_zlib.crc32
    monkeypatch.setattr(inflate, "USE_ISAL", False)
    assert inflate.fast_crc32() is (_compiled_crc32() or zlib.crc32)
    monkeypatch.setenv("GRADTOOL_NO_KERNELS", "1")
    assert inflate.fast_crc32() is zlib.crc32


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 300_000), start=st.integers(0, 2**32 - 1), offset=st.integers(0, 15))
def test_fast_crc32_is_zlibs_on_array_views_either_side_of_the_gil_release(n, start, offset):
    """What zipfile hands it: a memoryview of an array's bytes, from any alignment, below and above the
    64 KiB from which the compiled one lets go of the GIL."""
    data = np.random.default_rng(n).integers(0, 256, n + offset, dtype=np.uint8)[offset:]
    view = memoryview(data)
    for flag in (True, False):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(inflate, "USE_ISAL", flag)
            assert inflate.fast_crc32()(view, start) == zlib.crc32(data.tobytes(), start)


def test_npz_written_with_fast_crc_passes_zlibs_check(tmp_path, use_isal, monkeypatch):
    """The npz writer lets zipfile take CRC-32 from isal (when on), else from the compiled reader; the
    members' CRCs, checked again with zlib's crc32, are right, and switching both off puts zlib's back."""
    import zipfile

    from gradtool import save_dump

    monkeypatch.setattr(zipfile, "crc32", zipfile.crc32)  # whatever this test sets is undone after it

    p = str(tmp_path / "d.npz")
    t = {"w": np.random.default_rng(0).standard_normal((300, 70)).astype(np.float32), "b": np.arange(5.0)}
    save_dump(p, t)
    assert zipfile.crc32 is (isal_zlib.crc32 if use_isal else _compiled_crc32() or zlib.crc32)
    zipfile.crc32 = zlib.crc32
    with zipfile.ZipFile(p) as z:
        assert z.testzip() is None  # every member's CRC-32 recomputed by zlib matches the stored one
    got = _read_all(p)
    assert all(got[k].tobytes() == v.tobytes() for k, v in t.items())


def _stream_over(tmp_path, payload, piece, crc=None, expected=None, prefix=b"junk"):
    """An InflateStream over ``payload`` deflated (raw) and stored after ``prefix`` in a file."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    packed = c.compress(payload) + c.flush()
    p = tmp_path / "s.bin"
    p.write_bytes(prefix + packed + b"trailer")
    fd = os.open(p, os.O_RDONLY)
    stream = inflate.InflateStream(fd, len(prefix), len(packed), len(payload) if expected is None else expected,
                                   zlib.crc32(payload) if crc is None else crc, piece)
    return stream, fd


_payloads = st.one_of(st.binary(max_size=3000),
                      st.builds(lambda n, seed: np.random.default_rng(seed).integers(0, 4, n, dtype=np.uint8).tobytes(),
                                st.integers(0, 200_000), st.integers(0, 2**32 - 1)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=_payloads, piece=st.integers(1, 5000), reads=st.lists(st.integers(0, 70_000), max_size=8),
       skip=st.integers(0, 100), isal=st.booleans())
def test_inflate_stream_hands_out_the_inflated_bytes_in_any_pieces(tmp_path, payload, piece, reads, skip, isal):
    """skip + readinto of any sizes, any compressed piece size: the bytes zlib.decompress gives, in order;
    finish() accepts the stream."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(inflate, "USE_ISAL", isal)
        stream, fd = _stream_over(tmp_path, payload, piece)
        try:
            got = bytearray()
            skip = min(skip, len(payload))
            stream.skip(skip)
            for n in reads + [len(payload)]:
                buf = bytearray(n)
                k = stream.readinto(memoryview(buf))
                got += buf[:k]
            stream.finish()
        finally:
            os.close(fd)
    assert bytes(got) == payload[skip:]


@pytest.mark.parametrize("fail_after", [0, 1, 3])
def test_an_isal_error_mid_stream_hands_over_to_zlib_at_the_same_position(tmp_path, monkeypatch, fail_after):
    """When isal errs after handing out some bytes, zlib re-inflates them and goes on: the reader sees one
    unbroken stream; the CRC-32 is checked on zlib's bytes."""
    payload = np.random.default_rng(5).integers(0, 3, 100_000, dtype=np.uint8).tobytes()

    class Flaky:
        error = type("IsalError", (Exception,), {})
        crc32 = staticmethod(zlib.crc32)

        def decompressobj(self, wbits):
            real, calls = zlib.decompressobj(wbits), [0]

            class Inflater:
                def decompress(_, data, max_length=0):
                    calls[0] += 1
                    if calls[0] > fail_after:
                        raise Flaky.error("isal says no")
                    out = real.decompress(data, max_length)
                    _.unconsumed_tail = real.unconsumed_tail
                    return out

                def flush(_):
                    raise Flaky.error("isal says no")

            return Inflater()

    monkeypatch.setattr(inflate, "fast_zlib", lambda: Flaky())
    stream, fd = _stream_over(tmp_path, payload, 997)
    try:
        got = bytearray()
        buf = bytearray(4093)
        while k := stream.readinto(memoryview(buf)):
            got += buf[:k]
        stream.finish()
    finally:
        os.close(fd)
    assert bytes(got) == payload


@pytest.mark.parametrize("case,message", [
    ("crc", r"size or CRC-32 mismatch"),
    ("short", r"size or CRC-32 mismatch"),  # the member claims more bytes than the stream holds
    ("long", r"inflates to more than its size"),
    ("garbage", r"corrupt \(Error -3"),
])
def test_inflate_stream_refuses_what_does_not_match_its_member(tmp_path, case, message):
    payload = bytes(range(256)) * 300
    kw = {"crc": zlib.crc32(payload) ^ 1} if case == "crc" else {}
    kw |= {"expected": len(payload) + 1} if case == "short" else {}
    kw |= {"expected": len(payload) - 1} if case == "long" else {}
    stream, fd = _stream_over(tmp_path, payload, 4096, **kw)
    if case == "garbage":
        os.close(fd)
        p = tmp_path / "g.bin"
        p.write_bytes(b"\xff" * 5000)
        fd = os.open(p, os.O_RDONLY)
        stream = inflate.InflateStream(fd, 0, 5000, 10_000, 0, 4096)
    try:
        with pytest.raises(ValueError, match=message):
            stream.readinto(memoryview(bytearray(len(payload))))
            stream.finish()
    finally:
        os.close(fd)
