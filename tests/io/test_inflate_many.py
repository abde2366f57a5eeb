"""The compiled ``inflate_raw`` (gradtool/io/_inflate_many.c): many raw-deflate members inflated in one
call, each member's verdict the one zlib's ``decompress_exactly`` and a CRC-32 check give it (that is the
reference: an independent inflater, Python's zlib module, a member a call), its data where the table
says; and ``NpzReader.inflate_members`` gives the same bytes with and without it."""

import threading
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import open_dump
from gradtool.io import compiled

inflate_raw = compiled.member_inflater()
needs_inflater = pytest.mark.skipif(inflate_raw is None, reason="gradtool.io._inflate_many not built")


def _raw_deflate(data: bytes, level: int) -> bytes:
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def _reference(packed: bytes, head: int, size: int, crc: int) -> tuple[int, bytes | None]:
    """(status, data after the head) as Python's zlib judges the member."""
    d = zlib.decompressobj(-15)
    try:
        out = d.decompress(packed, head + size + 1)
    except zlib.error:
        return 1, None
    if len(out) != head + size or not d.eof or d.unused_data or d.unconsumed_tail:
        return 1, None
    return (0, out[head:]) if zlib.crc32(out) == crc else (2, None)


def _call(members: list[tuple[bytes, int, int, int]], gap: int = 3):
    """inflate_raw over ``members`` = (compressed bytes, head, data size, crc) laid out ``gap`` bytes
    apart; returns (status, [each member's data bytes in out])."""
    packed, rows, at = bytearray(), [], 0
    for blob, head, size, crc in members:
        packed += b"\xa5" * gap
        rows.append((len(packed), len(blob), head, at, size, crc))
        packed += blob
        at += size
    out = np.full(at, 0x5A, np.uint8)
    status = inflate_raw(bytes(packed), np.array(rows, np.int64).tobytes(), out)
    return list(status), [out[r[3]:r[3] + r[4]].tobytes() for r in rows]


member = st.tuples(st.binary(max_size=3000), st.integers(0, 40), st.integers(0, 9), st.sampled_from(
    ["ok", "ok", "ok", "crc", "truncated", "trailing", "more", "less", "flip"]), st.integers(0, 2**32 - 1))


@needs_inflater
@settings(max_examples=150, deadline=None)
@given(st.lists(member, min_size=1, max_size=12), st.integers(0, 5))
def test_each_member_gets_zlibs_verdict_and_its_data(members, repeat):
    cases = []
    for raw, head, level, damage, salt in members:
        data = raw * (1 + repeat)  # (repeats compress: matches, not only literals)
        head = min(head, len(data))
        blob, crc, size = _raw_deflate(data, level), zlib.crc32(data), len(data) - head
        if damage == "crc":
            crc ^= 1 << (salt % 32)
        elif damage == "truncated" and blob:
            blob = blob[: salt % len(blob)]
        elif damage == "trailing":
            blob += bytes([salt & 0xFF])
        elif damage == "more" and size:
            size -= 1  # the stream holds a byte more than the table says
        elif damage == "less":
            size += 1
        elif damage == "flip" and blob:
            b = bytearray(blob)
            b[salt % len(b)] ^= 1 << (salt % 8)
            blob = bytes(b)
        cases.append((blob, head, size, crc))
    status, datas = _call(cases)
    for (blob, head, size, crc), s, got in zip(cases, status, datas):
        want_status, want = _reference(blob, head, size, crc)
        assert s == want_status
        if want is not None:
            assert got == want


@needs_inflater
def test_edges_empty_data_whole_head_and_large_members():
    rng = np.random.default_rng(0)
    big = rng.standard_normal(600_000).astype(np.float32).tobytes()  # several of zlib's output windows
    cases = [(b"", 0), (b"\x93NUMPY header", 13), (big, 128), (bytes(70_000), 0)]
    members = [(_raw_deflate(d, 6), h, len(d) - h, zlib.crc32(d)) for d, h in cases]
    status, datas = _call(members, gap=0)
    assert status == [0, 0, 0, 0]
    assert datas == [b"", b"", big[128:], bytes(70_000)]


@needs_inflater
def test_a_header_longer_than_it_takes_is_left_to_the_python_path():
    data = bytes(range(256)) * 400
    status, _ = _call([(_raw_deflate(data, 1), (1 << 16) + 1, len(data) - (1 << 16) - 1, zlib.crc32(data))])
    assert status == [1]


@needs_inflater
@pytest.mark.parametrize("row", [(-1, 4, 0, 0, 0, 0), (0, 99, 0, 0, 0, 0), (0, 4, 0, 0, 11, 0),
                                 (0, 4, 0, 5, 6, 0), (0, 4, -1, 0, 0, 0), (0, 4, 0, 0, 0, 1 << 32)])
def test_rows_outside_the_buffers_are_refused_before_any_work(row):
    out = np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="outside the buffers"):
        inflate_raw(b"abcd", np.array([row], np.int64).tobytes(), out)
    with pytest.raises(ValueError, match="six int64"):
        inflate_raw(b"abcd", b"\0" * 40, out)
    with pytest.raises(TypeError):
        inflate_raw(b"abcd", np.zeros(6, np.int64).tobytes(), b"read-only")
    assert not out.any()


@needs_inflater
def test_threads_inflate_at_once_to_the_same_bytes():
    """It lets go of the GIL for the whole call: two threads at once get what one gets."""
    rng = np.random.default_rng(3)
    datas = [rng.standard_normal(int(rng.integers(1, 5000))).astype(np.float32).tobytes() for _ in range(300)]
    members = [(_raw_deflate(d, 6), 0, len(d), zlib.crc32(d)) for d in datas]
    results = [None, None]

    def work(i):
        results[i] = _call(members)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0] == results[1] == ([0] * 300, datas)


@pytest.mark.parametrize("damaged", [False, True])
def test_inflate_members_gives_the_same_bytes_with_and_without_the_extension(tmp_path, monkeypatch, damaged):
    rng = np.random.default_rng(4)
    t = {f"t{i}": (rng.standard_normal(int(rng.integers(1, 4000))) * 3).astype([np.float32, np.float16][i % 2])
         for i in range(60)}
    t["empty"] = np.zeros(0, np.float32)
    path = str(tmp_path / "c.npz")
    np.savez_compressed(path, **t)
    if damaged:  # a flipped byte in one member's deflate stream, another's CRC in the central directory
        import zipfile

        raw = bytearray(open(path, "rb").read())
        with zipfile.ZipFile(path) as z:
            zi = z.getinfo("t7.npy")
        raw[zi.header_offset + 30 + len("t7.npy") + zi.compress_size // 2] ^= 0x10
        cd = raw.find(b"t30.npy", raw.find(b"PK\x01\x02")) - 46
        raw[cd + 16] ^= 0xFF
        open(path, "wb").write(bytes(raw))

    def members(inflater):
        with monkeypatch.context() as m:
            m.setattr(compiled, "member_inflater", lambda: inflater)
            with open_dump(path) as r:
                out = np.zeros(sum(i.nbytes for i in r.tensors), np.uint8)
                views = r.inflate_members(r.tensors, out)
                return [None if v is None else bytes(v) for v in views], out

    python_path, out = members(None)
    assert [n for n, v in zip(t, python_path) if v is None] == (["t7", "t30"] if damaged else [])
    if not damaged:  # (every member's data in out, one after another)
        assert out.tobytes() == b"".join(python_path)
    for name, got in zip(t, python_path):
        if got is not None:
            assert got == t[name].tobytes()
    if inflate_raw is not None:
        compiled_path, _ = members(inflate_raw)
        assert compiled_path == python_path


@needs_inflater
def test_clip_inflates_the_next_run_on_the_worker(tmp_path, monkeypatch):
    """``clip`` of a compressed npz of many small tensors hands each next run of deflated members to a
    worker thread (clip_dump._RunsInflatedAhead): the same report and output file as without it."""
    import dataclasses

    from gradtool import clip_dump as clip_mod
    from gradtool.clip_dump import ClipSpec, clip_dump
    from gradtool.io.dump import make_writer

    rng = np.random.default_rng(6)
    t = {f"t{i}": rng.standard_normal(int(rng.integers(1, 3000))).astype(np.float32) for i in range(400)}
    src = str(tmp_path / "in.npz")
    np.savez_compressed(src, **t)
    monkeypatch.setattr(clip_mod, "RUN_BYTES", 32 << 10)

    def clipped(out):
        with open_dump(src) as r, make_writer(out, "npz", r.metadata, compress=True) as w:
            rep = clip_dump(r, w, ClipSpec(mode="global-norm", max=1.0))
        return [dataclasses.astuple(c) for c in rep.tensors], open(out, "rb").read()

    submitted = []
    pool = clip_mod._inflate_ahead_thread()
    real_submit = pool.submit
    monkeypatch.setattr(pool, "submit", lambda *a, **k: submitted.append(a) or real_submit(*a, **k))
    ahead = clipped(str(tmp_path / "a.npz"))
    assert len(submitted) > 10
    monkeypatch.setattr(compiled, "member_inflater", lambda: None)
    submitted.clear()
    assert clipped(str(tmp_path / "b.npz")) == ahead and not submitted
    with np.load(str(tmp_path / "a.npz")) as z:
        scale = np.float32(ahead[0][0][2] / ahead[0][0][1])
        np.testing.assert_allclose(z["t250"], t["t250"] * scale, rtol=1e-6)
