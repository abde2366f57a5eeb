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
