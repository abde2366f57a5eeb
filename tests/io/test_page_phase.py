"""Buffers placed in a page so that the kernel's copies into and out of them run at full speed: never a
destination 1-63 bytes after its source, modulo the page (see gradtool.io.base.buffer_phase). The results
do not depend on it; these tests hold the placement itself, at every point where gradtool reads a file
into a buffer of its own or writes one out."""

import json
import os
import struct

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gradtool.io.base as base
from gradtool import open_dump, save_dump
from gradtool.clip_dump import ClipSpec, clip_dump
from gradtool.io.base import (ALIAS_BYTES, PAGE, PLACED_ALLOCATION_BYTES, PhasedBuffer, address, buffer_phase,
                              copy_range)
from gradtool.io.dump import make_writer


def slow(destination: int, source: int) -> bool:
    """The kernel copy the placement avoids: the destination 1 to ALIAS_BYTES-1 bytes after the source."""
    return 0 < (destination - source) % PAGE < ALIAS_BYTES


offsets = st.integers(0, 1 << 40)


@settings(max_examples=300, deadline=None)
@given(reads=st.lists(offsets, max_size=20), writes=st.lists(offsets, max_size=20))
@example(reads=[0], writes=[])  # malloc's 16 bytes into a page were slow for page-aligned data
@example(reads=[], writes=[16])
@example(reads=[4090], writes=[30])  # both constraints at once, near a page's end and start
def test_buffer_phase_avoids_every_slow_copy(reads, writes):
    phase = buffer_phase(reads=reads, writes=writes)
    assert 0 <= phase < PAGE and phase % 64 == 0
    assert not any(slow(phase, a) for a in reads)  # pread: into the buffer
    assert not any(slow(b, phase) for b in writes)  # write: out of it


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 3 * PAGE), min_size=1, max_size=5),
       phases=st.lists(st.integers(0, PAGE - 1).map(lambda p: p & ~63), min_size=5, max_size=5))
def test_phased_buffer_views_start_where_asked_and_do_not_overlap_its_end(sizes, phases):
    buf = PhasedBuffer()
    for nbytes, phase in zip(sizes, phases):
        view = buf.get(nbytes, phase)
        assert view.dtype == np.uint8 and view.nbytes == nbytes and view.flags.writeable
        if nbytes:
            assert address(view) % PAGE == phase
            view[:] = 7  # the whole view is inside the buffer
            assert view[-1] == 7


def test_address_is_the_first_byte():
    a = np.arange(10, dtype=np.float32)
    assert address(a[3:]) - address(a) == 12 and address(a) == a.ctypes.data


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
@pytest.mark.parametrize("read_from", [None, 0, 16, 4095, (1 << 33) + 40])
def test_allocate_places_large_arrays_and_keeps_them_ordinary(read_from, dtype):
    from gradtool.io.base import PLACED_ALLOCATION_BYTES, TensorInfo, allocate

    for shape in [(3, 5), (300, 257), (PLACED_ALLOCATION_BYTES,)]:
        info = TensorInfo("t", shape, np.dtype(dtype))
        a = allocate(info, "f", read_from=read_from)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous and a.flags.writeable
        assert address(a) % np.dtype(dtype).alignment == 0
        if read_from is not None and info.nbytes >= PLACED_ALLOCATION_BYTES:
            assert not slow(address(a), read_from)
        a[...] = 1  # every byte is the array's own
        assert np.count_nonzero(a) == a.size


def _record_preadv(monkeypatch):
    seen = []
    real = os.preadv

    def preadv(fd, buffers, offset, *args):
        seen.append((address(np.frombuffer(buffers[0], np.uint8)), offset))
        return real(fd, buffers, offset, *args)

    monkeypatch.setattr(base.os, "preadv", preadv)
    return seen


@pytest.mark.parametrize("start", [0, 1, 16, 31, 63, 100, 4095])
def test_reads_into_the_readers_buffers_are_placed(tmp_path, monkeypatch, start):
    """Unaligned members of np.savez files are pread into the reader's buffer; so is a small piece of any
    file; a whole tensor read at once (``read``) goes into an array placed for it. Data starting at page
    phases around malloc's 16 bytes."""
    a = np.random.default_rng(start).standard_normal(70_000).astype(np.float32)
    raw = tmp_path / "raw.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [a.size], "data_offsets": [0, a.nbytes]}}).encode()
    header += b" " * ((start - 8 - len(header)) % PAGE)  # the data starts `start` bytes into a page
    raw.write_bytes(struct.pack("<Q", len(header)) + header + a.tobytes())
    np.savez(tmp_path / "np.npz", w=a, b=a[:999])  # np.savez's members start anywhere
    paths = (raw, tmp_path / "np.npz")
    # the reference values first, unrecorded: read() of a tensor under PLACED_ALLOCATION_BYTES goes into an
    # ordinary array, placed by malloc's luck (test_allocate_places_large_arrays_and_keeps_them_ordinary)
    whole = {}
    for path in paths:
        with open_dump(str(path)) as r:
            whole.update({(path, n): r.read(n).reshape(-1) for n in r.names})
    seen = _record_preadv(monkeypatch)
    for path in paths:
        with open_dump(str(path)) as r:
            for info in r.tensors:
                location = r.raw_location(info)
                got = np.concatenate([c.copy() for c in r.iter_chunks(info, 4096)]) if location else None
                stop = min(1000, info.size)
                for w in r.range_window(location, info, 5, stop, copy=True) if location else ():
                    assert np.array_equal(w, whole[path, info.name][5:stop])
                if got is not None:
                    assert np.array_equal(got, whole[path, info.name])
    assert seen, "nothing was read into a buffer of gradtool's"
    assert not [(d, s) for d, s in seen if slow(d, s)]


@pytest.mark.parametrize("dest", [0, 8, 16, 40, 2000, 4090])
def test_copy_range_through_user_space_places_its_buffer(tmp_path, monkeypatch, dest):
    """The pread/pwrite copy (out of phase, or without copy_file_range): neither copy slow."""
    data = np.random.default_rng(dest).integers(0, 255, 3 * PAGE + 77, dtype=np.uint8).tobytes()
    (tmp_path / "src").write_bytes(data)
    reads = _record_preadv(monkeypatch)
    writes = []
    real_pwrite = os.pwrite
    monkeypatch.setattr(base.os, "pwrite", lambda fd, b, off: writes.append((off, address(np.frombuffer(b, np.uint8))))
                        or real_pwrite(fd, b, off))
    fd_in = os.open(tmp_path / "src", os.O_RDONLY)
    fd_out = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT)
    try:
        copy_range((fd_in, 5), fd_out, dest, len(data) - 5, "src: tensor 'x'")
        assert os.pread(fd_out, len(data), dest) == data[5:]
    finally:
        os.close(fd_in)
        os.close(fd_out)
    if (5 - dest) % PAGE:  # out of phase: the user-space loop
        assert reads and writes
    assert not [r for r in reads if slow(*r)] and not [w for w in writes if slow(*w)]


@pytest.mark.parametrize("fmt", ["safetensors", "h5", "npz"])
@pytest.mark.parametrize("start", [0, 16, 48, 2024])
def test_clip_writes_out_of_a_placed_buffer(tmp_path, monkeypatch, fmt, start):
    """Every chunk clip writes leaves from a buffer placed for the spot it goes to in the output."""
    a = np.random.default_rng(start).standard_normal(300_000).astype(np.float32)
    src = tmp_path / "in.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [a.size], "data_offsets": [0, a.nbytes]},
                         "b": {"dtype": "F32", "shape": [100], "data_offsets": [a.nbytes, a.nbytes + 400]}}).encode()
    header += b" " * ((start - 8 - len(header)) % PAGE)
    src.write_bytes(struct.pack("<Q", len(header)) + header + a.tobytes() + a[:100].tobytes())
    writes = []  # (where in the output file, the address of the bytes written there, how many)
    real_pwrite = os.pwrite  # the HDF5 writer's
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: writes.append(
        (offset, address(np.frombuffer(data, np.uint8)), len(data))) or real_pwrite(fd, data, offset))
    out = str(tmp_path / f"out.{fmt}")
    with open_dump(str(src)) as r, make_writer(out, {"h5": "hdf5"}.get(fmt, fmt), r.metadata) as w:
        if fmt != "h5":  # safetensors and npz write through a file object: where each chunk goes
            position = (lambda: w._f.tell()) if fmt == "safetensors" else (lambda: w._zip.fp.tell())
            real_add = w.add_chunks

            def add_chunks(info, chunks):
                def observed():
                    for c in chunks:
                        writes.append((position(), address(c), c.nbytes))
                        yield c
                return real_add(info, observed())

            w.add_chunks = add_chunks
        result = clip_dump(r, w, ClipSpec("global-norm", max=1e-3).validate())
    monkeypatch.undo()
    # tensor "b" (400 bytes) is below PLACED_ALLOCATION_BYTES: wherever malloc put it (1 run in ~30 found
    # it 1-31 bytes off), a phase copy of 400 bytes costs nothing
    big = [(dst, src) for dst, src, n in writes if n >= PLACED_ALLOCATION_BYTES]
    assert big, "no write was seen"
    assert not [x for x in big if slow(*x)]
    with open_dump(out) as r:  # and the output is right
        np.testing.assert_array_equal(r.read("w"), (a * np.float32(result.scale)).astype(np.float32))


@pytest.mark.parametrize("mode", ["global-norm", "norm"])
def test_the_buffers_are_reused_across_tensors(tmp_path, monkeypatch, mode):
    """clip_dump makes its buffers once per call (clip's work buffer, the reader's read buffer), not once
    per tensor: twice the tensors, the same number of PhasedBuffers."""
    made = []
    real = PhasedBuffer.__init__

    def init(self):
        made.append(self)
        real(self)

    monkeypatch.setattr(PhasedBuffer, "__init__", init)
    counts = []
    for n in (6, 12):
        save_dump(str(tmp_path / f"in{n}.safetensors"), {f"t{i}": np.ones(5000, np.float32) for i in range(n)})
        made.clear()
        with open_dump(str(tmp_path / f"in{n}.safetensors")) as r, \
                make_writer(str(tmp_path / f"out{n}.safetensors"), "safetensors", r.metadata) as w:
            clip_dump(r, w, ClipSpec(mode, max=1e-3).validate())
        counts.append(len(made))
    assert counts[0] == counts[1] <= 2


def test_stored_members_crcs_read_together_go_into_a_placed_buffer(tmp_path, monkeypatch):
    """The CRC-32 check of small stored members reads their span with one pread (``_crcs_by_pread``):
    into a placed buffer at every phase of the span's start (a bytearray was placed by malloc's luck,
    and this test's sibling above failed now and then for it), with the CRCs of the bytes read."""
    import zlib

    np.savez(tmp_path / "np.npz", w=np.arange(3000, dtype=np.float32))
    data = (tmp_path / "np.npz").read_bytes()
    seen = _record_preadv(monkeypatch)
    with open_dump(str(tmp_path / "np.npz")) as r:
        for lo in range(0, PAGE, 67):
            for length in (1, 1000, 5000):
                parts = [("a", lo, lo + length // 2), ("b", lo + length // 2, lo + length)]
                got = r._crcs_by_pread(parts, zlib.crc32)
                assert got == [(n, zlib.crc32(data[a:b]), b - a) for n, a, b in parts]
    assert len(seen) >= 3 * len(range(0, PAGE, 67))
    assert not [(d, s) for d, s in seen if slow(d, s)]
