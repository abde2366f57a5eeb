"""Writers reserve their output's disk blocks before writing (fallocate with FALLOC_FL_KEEP_SIZE): never
more than the file ends up holding (blocks past the end would stay allocated), the file's size untouched
by it, and the same bytes written as without it."""

import os

import numpy as np
import pytest

from gradtool import open_dump, save_dump
from gradtool.clip_dump import ClipSpec, clip_dump
from gradtool.io import atomic
from gradtool.io.atomic import preallocate
from gradtool.io.base import TensorInfo
from gradtool.io.dump import make_writer

BLOCK = 4096


def _anywhere(monkeypatch) -> None:
    """Reservations of any size, on any filesystem (the tests' temporary directory may be a tmpfs)."""
    monkeypatch.setattr(atomic, "PREALLOCATE_MIN", 0)
    monkeypatch.setattr(atomic, "PREALLOCATING_FILESYSTEMS", _EVERY_FILESYSTEM)


class _Every:
    def __contains__(self, kind):
        return True


_EVERY_FILESYSTEM = _Every()


def _reservations(monkeypatch) -> list[tuple[str, int, int]]:
    """Every reservation made from now on, as (file path, start, bytes), and none skipped for its size or
    filesystem."""
    _anywhere(monkeypatch)
    seen: list[tuple[str, int, int]] = []
    real = atomic.preallocate

    def spy(fd, start, nbytes):
        seen.append((os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else "?", start, nbytes))
        return real(fd, start, nbytes)

    for module in ("safetensors", "npz", "hdf5"):
        monkeypatch.setattr(f"gradtool.io.{module}.preallocate", spy)
    return seen


def _filesystem_reserves(tmp_path) -> bool:
    """Whether fallocate reserves blocks here (Linux, and a filesystem that has it)."""
    fd = os.open(tmp_path / "probe", os.O_RDWR | os.O_CREAT)
    try:
        with pytest.MonkeyPatch.context() as mp:
            _anywhere(mp)
            return preallocate(fd, 0, 1 << 20)
    finally:
        os.close(fd)
        os.remove(tmp_path / "probe")


def _no_blocks_past_the_end(path) -> None:
    st = os.stat(path)
    if hasattr(st, "st_blocks"):
        # data blocks up to the end, and a few for the extent tree of a fragmented file
        assert st.st_blocks * 512 <= -(-st.st_size // BLOCK) * BLOCK + 8 * BLOCK, (st.st_size, st.st_blocks)


def test_reserves_blocks_without_changing_the_size(tmp_path, monkeypatch):
    _anywhere(monkeypatch)
    p = tmp_path / "f.bin"
    fd = os.open(p, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"head")
        if not preallocate(fd, 0, 4 << 20):
            pytest.skip("this filesystem (or OS) does not reserve blocks")
        st = os.fstat(fd)
        assert st.st_size == 4 and st.st_blocks * 512 >= 4 << 20
        os.pwrite(fd, b"tail", 4)
        assert os.fstat(fd).st_size == 8
        os.ftruncate(fd, 8)  # what the HDF5 writer does with what the file did not reach: freed
        assert os.fstat(fd).st_blocks * 512 <= 2 * BLOCK
    finally:
        os.close(fd)
    assert p.read_bytes() == b"headtail"


def test_nothing_is_reserved_under_the_minimum_or_where_the_call_is_refused(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(atomic, "_fallocate", lambda: lambda *a: calls.append(a) or 0)
    monkeypatch.setattr(atomic, "filesystem_of", lambda fd: "ext4")
    fd = os.open(tmp_path / "f.bin", os.O_RDWR | os.O_CREAT)
    try:
        assert not preallocate(fd, 0, atomic.PREALLOCATE_MIN - 1) and not calls
        assert preallocate(fd, 0, atomic.PREALLOCATE_MIN) and calls == [(fd, 1, 0, atomic.PREALLOCATE_MIN)]
        monkeypatch.setattr(atomic, "_fallocate", lambda: None)  # not Linux
        assert not preallocate(fd, 0, atomic.PREALLOCATE_MIN)
    finally:
        os.close(fd)
    monkeypatch.undo()
    _anywhere(monkeypatch)
    r, w = os.pipe()
    try:
        assert not preallocate(w, 0, 1 << 20)  # refused (ESPIPE): no error
    finally:
        os.close(r)
        os.close(w)


def _tensors(rng) -> dict[str, np.ndarray]:
    """Tensors over and under the HDF5 writer's 64 KiB, of three types, and an empty one."""
    return {"big": rng.standard_normal((300, 257)).astype(np.float32),
            "mid": rng.standard_normal(20_000).astype(np.float64),
            "small": rng.standard_normal(7).astype(np.float16),
            "empty": np.zeros((0, 3), np.float32),
            "ints": np.arange(40_000, dtype=np.int32)}


@pytest.mark.parametrize("ext", ["safetensors", "npz", "h5"])
@pytest.mark.parametrize("how", ["save", "clip", "clip-nothing"])
def test_writers_reserve_no_more_than_the_file_holds(tmp_path, monkeypatch, ext, how):
    """Saved, clipped (every tensor rewritten) and copied (nothing to clip: the kernel's copy): each output
    reserved once, the safetensors header's exact size, the others no more than the file ends at; the
    file reads back as the tensors, with no blocks allocated past its end."""
    rng = np.random.default_rng(0)
    t = _tensors(rng)
    src = tmp_path / f"src.{ext}"
    out = tmp_path / f"out.{ext}"
    if how == "save":
        seen = _reservations(monkeypatch)
        save_dump(str(out), t)
        want = t
    else:
        save_dump(str(src), t)
        seen = _reservations(monkeypatch)
        spec = ClipSpec("global-norm", max=1.0 if how == "clip" else 1e30)
        with open_dump(str(src)) as r, atomic.atomic_output(str(out), durable=False) as tmp, \
                make_writer(tmp, "hdf5" if ext == "h5" else ext, r.metadata) as w:
            clip_dump(r, w, spec)
        total = np.sqrt(sum(float(np.sum(np.square(a.astype(np.float64)))) for k, a in t.items() if k != "ints"))
        scale = min(1.0, 1.0 / total) if how == "clip" else 1.0
        want = {k: (a if k == "ints" else (a.astype(np.float64) * scale).astype(a.dtype)) for k, a in t.items()}
    size = os.path.getsize(out)
    assert len(seen) == 1
    _, start, nbytes = seen[0]
    data = sum(a.nbytes for a in t.values())
    if ext == "safetensors":
        assert start == 0 and nbytes == size
    elif ext == "npz":
        assert data < start + nbytes <= size
    else:  # the contiguous datasets of 64 KiB or more, from where the file (superblock, root group) ends
        assert start > 0 and nbytes == t["big"].nbytes + t["mid"].nbytes + t["ints"].nbytes and start + nbytes <= size
    with open_dump(str(out)) as r:
        for k, a in want.items():
            got = r.read(k)
            assert got.dtype == a.dtype and got.shape == a.shape
            np.testing.assert_allclose(got.astype(np.float64), a.astype(np.float64), rtol=2e-3 if k == "small" else 1e-6)
    if _filesystem_reserves(tmp_path):
        _no_blocks_past_the_end(out)


def test_the_hdf5_writer_frees_what_its_file_did_not_reach(tmp_path, monkeypatch):
    """A reservation past where the HDF5 file ends (planned tensors HDF5 placed elsewhere, or not written)
    is given back when the writer closes."""
    from gradtool.io.hdf5 import Hdf5Writer

    if not _filesystem_reserves(tmp_path):
        pytest.skip("this filesystem (or OS) does not reserve blocks")
    _anywhere(monkeypatch)
    a = np.ones(1000, np.float32)
    p = tmp_path / "d.h5"
    w = Hdf5Writer(str(p))
    w.plan([TensorInfo("a", a.shape, a.dtype), TensorInfo("never", (1 << 22,), np.dtype(np.float32))])
    w.add_chunks(TensorInfo("a", a.shape, a.dtype), iter([a]))
    w.set_group_attrs("", {"note": np.zeros(10_000)})  # HDF5 writes it last: it does not cut the file itself
    w.close()
    _no_blocks_past_the_end(p)
    with open_dump(str(p)) as r:
        assert r.names == ["a"] and r.read("a").tolist() == a.tolist()


def test_an_hdf5_writer_into_a_file_it_does_not_own_reserves_nothing(tmp_path, monkeypatch):
    """(The Recorder's steps, written into one open file: its owner closes it, and would not free them.)"""
    import h5py

    from gradtool.io.hdf5 import Hdf5Writer

    seen = _reservations(monkeypatch)
    with h5py.File(tmp_path / "r.h5", "w") as f:
        w = Hdf5Writer(str(tmp_path / "r.h5"), file=f)
        w.plan([TensorInfo("a", (1 << 20,), np.dtype(np.float32))])
        w.close()
    assert seen == []


@pytest.mark.parametrize("kind,reserved", [("ext4", True), ("tmpfs", False), ("xfs", False), (None, False)])
def test_blocks_are_reserved_on_ext4_only(tmp_path, monkeypatch, kind, reserved):
    """(Measured to pay there; on tmpfs a reserved page is a zeroed page of memory: slower.)"""
    calls = []
    monkeypatch.setattr(atomic, "_fallocate", lambda: lambda *a: calls.append(a) or 0)
    monkeypatch.setattr(atomic, "filesystem_of", lambda fd: kind)
    assert preallocate(5, 0, atomic.PREALLOCATE_MIN) is reserved
    assert len(calls) == reserved
