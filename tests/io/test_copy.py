"""Unchanged tensors copied inside the kernel (copy_file_range) instead of streamed through Python: the same
bytes and the same report as the streamed path, whatever the kernel allows."""

import dataclasses
import errno
import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gradtool.clip_dump as clip_module
from gradtool import open_dump, save_dump
from gradtool.clip_dump import ClipSpec, clip_dump
from gradtool.errors import InputError
from gradtool.io.base import PAGE, copy_range
from gradtool.io.dump import make_writer


def _files(tmp_path, data: bytes):
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    fd_in = os.open(src, os.O_RDONLY)
    fd_out = os.open(tmp_path / "dst.bin", os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    return fd_in, fd_out


def _kernel(monkeypatch, how: str) -> None:
    """copy_file_range as it is, missing (another OS), refused at once (another filesystem), or refused
    after a first partial copy."""
    real = getattr(os, "copy_file_range", None)
    if how == "missing":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    elif how == "refused":
        def refuse(*a):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        monkeypatch.setattr(os, "copy_file_range", refuse, raising=False)
    elif how == "partial" and real is not None:
        calls = []

        def partial(src, dst, count, off_src, off_dst):
            calls.append(1)
            if len(calls) > 1:
                raise OSError(errno.ENOSYS, "Function not implemented")
            return real(src, dst, min(count, 1000), off_src, off_dst)
        monkeypatch.setattr(os, "copy_file_range", partial)


@pytest.mark.parametrize("filesystem", ["shares", "copies"])
@pytest.mark.parametrize("how", ["native", "missing", "refused", "partial"])
@given(size=st.integers(0, 700_000), src_off=st.integers(0, 5000), dst_off=st.integers(0, 5000))
@example(size=300_000, src_off=100, dst_off=100)  # in phase: the kernel copies (or starts to)
@example(size=300_000, src_off=8, dst_off=8 + 4096)  # in phase, another page
@example(size=300_000, src_off=8, dst_off=16)  # out of phase: pread/pwrite
@example(size=10, src_off=3, dst_off=7)  # less than a page: the kernel, whatever the phase
@example(size=3 * 65536, src_off=0, dst_off=0)  # whole chunks of the user-space copy
@settings(max_examples=25, deadline=None)
def test_copy_range_copies_the_bytes_whatever_the_kernel_allows(tmp_path_factory, filesystem, how, size, src_off,
                                                                dst_off):
    """On a filesystem where the kernel's copy may share extents and on one where it copies pages (the
    user-space copy taken then: in chunks made smaller here, read ahead on a worker thread)."""
    import gradtool.io.base as base

    with pytest.MonkeyPatch.context() as mp:
        _kernel(mp, how)
        mp.setattr(base, "kernel_copy_pays", lambda fd: filesystem == "shares")
        mp.setattr(base, "COPY_CHUNK", 65536)
        tmp_path = tmp_path_factory.mktemp("copy")
        data = np.random.default_rng(size).integers(0, 256, src_off + size + 17, np.uint8).tobytes()
        fd_in, fd_out = _files(tmp_path, data)
        try:
            os.lseek(fd_in, 3, os.SEEK_SET)
            os.lseek(fd_out, 5, os.SEEK_SET)
            copy_range((fd_in, src_off), fd_out, dst_off, size, "src.bin: tensor 't'")
            assert os.lseek(fd_in, 0, os.SEEK_CUR) == 3 and os.lseek(fd_out, 0, os.SEEK_CUR) == 5  # positions kept
            written = os.pread(fd_out, dst_off + size + 10, 0)
        finally:
            os.close(fd_in)
            os.close(fd_out)
        assert written[dst_off:] == data[src_off: src_off + size]
        assert written[:dst_off] == b"\0" * dst_off if size else len(written) == 0


@pytest.mark.parametrize("how", ["native", "refused"])
def test_copy_range_of_a_truncated_source_names_file_and_tensor(tmp_path, monkeypatch, how):
    _kernel(monkeypatch, how)
    fd_in, fd_out = _files(tmp_path, b"x" * 1000)
    try:
        with pytest.raises(InputError, match=r"^in\.safetensors: tensor 'w' is truncated$"):
            copy_range((fd_in, 100), fd_out, 0, 5000, "in.safetensors: tensor 'w'")
    finally:
        os.close(fd_in)
        os.close(fd_out)


def test_copy_range_passes_on_errors_other_than_a_refusal(tmp_path, monkeypatch):
    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "copy_file_range", full, raising=False)
    fd_in, fd_out = _files(tmp_path, b"x" * 1000)
    try:
        with pytest.raises(OSError) as info:
            copy_range((fd_in, 0), fd_out, 0, 1000, "in: tensor 'w'")
        assert info.value.errno == errno.ENOSPC
    finally:
        os.close(fd_in)
        os.close(fd_out)


_REAL_COPIED = clip_module._copied  # as imported, before any test patches it


def _clip_both_ways(src: str, out_dir, spec: ClipSpec, monkeypatch, out_fmt: str = "safetensors"):
    """(report, tensors' bytes, copies made) of clipping ``src`` into ``out_fmt`` with copies allowed,
    then with every tensor streamed."""
    made = []
    real = _REAL_COPIED

    def counted(*a):
        done = real(*a)
        made.append(done)
        return done

    outcomes = []
    for copies in (True, False):
        monkeypatch.setattr(clip_module, "_copied", counted if copies else (lambda *a: False))
        out = os.path.join(out_dir, f"out_{copies}.{'h5' if out_fmt == 'hdf5' else out_fmt}")
        with open_dump(src) as r, make_writer(out, out_fmt, r.metadata) as w:
            rep = clip_dump(r, w, spec)
        with open_dump(out) as r:
            tensors = {n: (r.info(n).dtype.str, r.info(n).shape, repr(r.info(n).attrs), r.read(n).tobytes())
                       for n in r.names}
        os.remove(out)
        outcomes.append((repr([dataclasses.astuple(t) for t in rep.tensors]),
                         repr((rep.global_norm_before, rep.global_norm_after, rep.scale)), tensors))
    return outcomes[0], outcomes[1], sum(made)


_dtypes = st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32])
_tensor = st.tuples(_dtypes, st.integers(0, 40_000), st.booleans())
_specs = st.sampled_from([ClipSpec("global-norm", max=1e30), ClipSpec("global-norm", max=1e-3),
                          ClipSpec("norm", max=30.0), ClipSpec("average-norm", max=0.5),
                          ClipSpec("value", max=2.5), ClipSpec("global-norm", max=1e30, select=["t1*"]),
                          ClipSpec("global-norm", max=1e30, nonfinite="zero"),
                          ClipSpec("norm", max=30.0, nonfinite="propagate")])


@given(tensors=st.lists(_tensor, min_size=1, max_size=5), meta=st.integers(0, 5000), spec=_specs,
       fmt=st.sampled_from(["safetensors", "npz", "np.savez", "h5"]), out_fmt=st.sampled_from(["safetensors", "hdf5"]))
@settings(max_examples=80, deadline=None)
def test_clip_with_copies_equals_clip_streamed(tmp_path_factory, tensors, meta, spec, fmt, out_fmt):
    """Bytes out, norms before and after to the bit, changed counts and the scale are those of the
    streamed path, for every input and output format, dtype, header length (and so page phase), mode and
    NaN policy."""
    tmp = tmp_path_factory.mktemp("clip")
    rng = np.random.default_rng(len(tensors) * 7919 + meta)
    arrays = {}
    for i, (dtype, size, nan) in enumerate(tensors):
        if dtype is ml_dtypes.bfloat16 and (fmt != "safetensors" or out_fmt != "safetensors"):
            dtype = np.float32  # npz has no bfloat16, and HDF5 stores it as opaque bytes
        a = (rng.standard_normal(size) * 3).astype(dtype)
        if nan and size and np.issubdtype(np.dtype(dtype), np.floating):
            a[size // 2] = np.nan
        arrays[f"t{i}"] = a
    src = str(tmp / ("in." + {"np.savez": "npz", "h5": "h5"}.get(fmt, fmt)))
    if fmt == "np.savez":
        np.savez(src, **arrays)
    else:
        save_dump(src, arrays, metadata={"note": "x" * meta})
    has_nan = any(np.isnan(v.astype(np.float64)).any() for v in arrays.values())
    if spec.nonfinite == "error" and has_nan:
        spec = dataclasses.replace(spec, nonfinite="propagate")
    with pytest.MonkeyPatch.context() as mp:
        with_copies, streamed, made = _clip_both_ways(src, tmp, spec, mp, out_fmt)
    assert with_copies == streamed
    if fmt == "safetensors" and spec.mode == "global-norm" and spec.max == 1e30 and spec.nonfinite != "zero" \
            and not has_nan:  # nothing changes: every tensor was copied (HDF5 has no empty or 0-d copies)
        assert made == (len(arrays) if out_fmt == "safetensors" else sum(a.size > 0 for a in arrays.values()))


@pytest.mark.parametrize("nonfinite", ["zero", "propagate"])
def test_nan_and_fortran_order_are_never_copied_as_they_are(tmp_path, monkeypatch, nonfinite):
    """Under "zero" a NaN is zeroed even where nothing is scaled (the norm before is taken after zeroing,
    so it looks finite): a tensor that held one is not copied; one that held none is, under every policy.
    A Fortran-ordered member is rewritten in C order."""
    a = np.arange(12, dtype=np.float32)
    a[3] = np.nan
    tensors = {"nan": a, "fortran": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
               "plain": np.ones(5, np.float32)}
    src = str(tmp_path / "in.npz")
    np.savez(src, **tensors)
    for exclude in ([], ["fortran"]):  # a tensor left out is written as it is, but in C order
        spec = ClipSpec("norm", max=1e30, nonfinite=nonfinite, exclude=exclude)
        with_copies, streamed, made = _clip_both_ways(src, str(tmp_path), spec, monkeypatch)
        assert with_copies == streamed
        # "plain" is copied ("nan" is zeroed under "zero", and scaled by its NaN norm under propagate, as TF)
        assert made == 1
    out = with_copies[2]
    assert np.frombuffer(out["fortran"][-1], np.float32).tolist() == list(range(12))  # C order
    assert np.isnan(np.frombuffer(out["nan"][-1], np.float32)[3]) == (nonfinite == "propagate")


def test_hdf5_dataset_attributes_and_groups_survive_the_copy(tmp_path, monkeypatch):
    """An HDF5 step with nothing to clip: every dataset copied into its allocated storage, with its
    attributes and its place in the group tree."""
    import h5py

    src = str(tmp_path / "in.h5")
    with h5py.File(src, "w") as f:
        f.create_dataset("layer/w", data=np.arange(5000, dtype=np.float32).reshape(50, 100))
        f["layer/w"].attrs["units"] = "grad"
        f.create_dataset("b", data=np.ones(7, np.float64))
    with_copies, streamed, made = _clip_both_ways(src, str(tmp_path), ClipSpec("norm", max=1e9), monkeypatch, "hdf5")
    assert with_copies == streamed and made == 2
    assert "units" in with_copies[2]["layer/w"][2] and with_copies[2]["layer/w"][1] == (50, 100)


def test_unchanged_dump_is_copied_in_page_phase_and_stays_readable(tmp_path, monkeypatch):
    """A step that needs no clipping: every tensor copied, the output's data placed at the input's point
    of a page (a header padded with spaces, as the format allows), and the safetensors library reads it."""
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((300, 70)).astype(np.float32), "b": rng.standard_normal(70).astype(np.float32)}
    src = str(tmp_path / "hf.safetensors")
    save_file(arrays, src, metadata={"step": "3"})  # written by the reference library: its own header
    with_copies, streamed, made = _clip_both_ways(src, str(tmp_path), ClipSpec("global-norm", max=1e9), monkeypatch)
    assert with_copies == streamed and made == 2
    out = str(tmp_path / "out.safetensors")
    with open_dump(src) as r, make_writer(out, "safetensors", r.metadata) as w:
        clip_dump(r, w, ClipSpec("global-norm", max=1e9))
        first_in = r.raw_location(r.tensors[0])[1]
    with open_dump(out) as r:
        first_out = r.raw_location(r.tensors[0])[1]
    assert first_out % PAGE == first_in % PAGE
    loaded = load_file(out)
    assert all(np.array_equal(loaded[k], v) for k, v in arrays.items())


@pytest.mark.parametrize("out_fmt", ["safetensors", "hdf5"])
def test_out_of_phase_ranges_are_copied_through_user_space(tmp_path, monkeypatch, out_fmt):
    """A range of a page or more whose input and output offsets fall at different points of a page is
    copied with pread/pwrite (the kernel copies such ranges at half speed); a smaller one, or one in
    phase, by copy_file_range."""
    if not hasattr(os, "copy_file_range"):
        pytest.skip("os.copy_file_range is Linux-only: everything goes through pread/pwrite here")
    big, small = np.arange(3 * PAGE, dtype=np.float32), np.arange(10, dtype=np.float32)
    src = str(tmp_path / "in.safetensors")
    save_dump(src, {"big": big, "small": small})
    import gradtool.io.base as base

    monkeypatch.setattr(clip_module, "_data_phase", lambda reader: 8)  # force the phase off
    monkeypatch.setattr(base, "kernel_copy_pays", lambda fd: True)  # (a filesystem sharing extents)
    counts = []
    real = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range", lambda *a: counts.append(a[2]) or real(*a))
    with_copies, streamed, made = _clip_both_ways(src, str(tmp_path), ClipSpec("global-norm", max=1e9),
                                                  monkeypatch, out_fmt)
    assert with_copies == streamed and made == 2
    assert counts and all(n < PAGE for n in counts)  # only "small" went through the kernel
    counts.clear()
    fd_in, fd_out = _files(tmp_path, big.tobytes())
    try:
        copy_range((fd_in, 8), fd_out, PAGE + 8, big.nbytes - 8, "in: tensor 'big'")  # in phase
    finally:
        os.close(fd_in)
        os.close(fd_out)
    assert sum(counts) == big.nbytes - 8


@pytest.mark.parametrize("size", [10, PAGE, 5 << 20])
def test_on_a_filesystem_that_copies_pages_a_page_or_more_is_copied_through_user_space(tmp_path, monkeypatch,
                                                                                        size):
    """(ext4, tmpfs: the kernel's copy is the slower there.) Less than a page still goes to the kernel."""
    import gradtool.io.base as base

    if not hasattr(os, "copy_file_range"):
        pytest.skip("os.copy_file_range is Linux-only: everything goes through pread/pwrite here")
    monkeypatch.setattr(base, "kernel_copy_pays", lambda fd: False)
    counts = []
    real = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range", lambda *a: counts.append(a[2]) or real(*a))
    data = np.random.default_rng(size).integers(0, 256, size + 100, np.uint8).tobytes()
    fd_in, fd_out = _files(tmp_path, data)
    try:
        copy_range((fd_in, 100), fd_out, 100, size, "in: tensor 't'")
        written = os.pread(fd_out, size + 100, 0)
    finally:
        os.close(fd_in)
        os.close(fd_out)
    assert written[100:] == data[100:]
    assert counts == ([size] if size < PAGE else [])


_MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:21 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw,size=24684100k
30 22 0:40 / /mnt/with\\040space rw,relatime shared:9 master:2 - xfs /dev/vdb1 rw,attr2
31 22 0:41 / /srv rw - nfs4 host:/export rw,vers=4.2
32 22 8:3 / /odd rw
"""


@pytest.mark.parametrize("device,expected", [((254, 0), "ext4"), ((0, 21), "tmpfs"), ((0, 40), "xfs"),
                                             ((0, 41), "nfs4"), ((8, 3), None), ((9, 9), None)])
def test_the_filesystem_of_a_device_is_read_from_mountinfo(tmp_path, device, expected):
    """Optional fields (shared:, master:) before the "-", escaped mount points; a line without the "-"
    and a device not listed give None."""
    from gradtool.io.atomic import _mounted_filesystem

    p = tmp_path / "mountinfo"
    p.write_text(_MOUNTINFO)
    assert _mounted_filesystem(os.makedev(*device), str(p)) == expected
    assert _mounted_filesystem(os.makedev(*device), str(tmp_path / "missing")) is None


@pytest.mark.parametrize("kind,pays", [("ext4", False), ("tmpfs", False), ("xfs", True), ("btrfs", True),
                                       ("nfs4", True), (None, True)])
def test_kernel_copy_pays_but_on_filesystems_that_copy_pages(tmp_path, monkeypatch, kind, pays):
    """By the type of the filesystem the output's device is mounted from, looked up once a device."""
    import gradtool.io.base as base
    from gradtool.io import atomic

    seen = []
    monkeypatch.setattr(atomic.sys, "platform", "linux")
    monkeypatch.setattr(atomic, "_filesystem_of_device", {})
    monkeypatch.setattr(atomic, "_mounted_filesystem", lambda device: seen.append(device) or kind)
    fd = os.open(tmp_path / "out.bin", os.O_RDWR | os.O_CREAT)
    try:
        assert [base.kernel_copy_pays(fd) for _ in range(3)] == [pays] * 3
        device = os.fstat(fd).st_dev
    finally:
        os.close(fd)
    assert seen == [device]


# Writes in pieces of at most WRITE_PIECE bytes (large buffered writes were slow and erratic on ext4)

def test_write_all_hands_over_every_byte_in_pieces():
    from gradtool.io.base import WRITE_PIECE, write_all

    class Recorder:
        def __init__(self):
            self.pieces = []

        def write(self, b):
            self.pieces.append(bytes(b))
            return len(b)

    data = np.random.default_rng(0).integers(0, 256, 4 * WRITE_PIECE + 5, dtype=np.uint8)
    for n in (0, 1, WRITE_PIECE, WRITE_PIECE + 1, len(data)):
        f = Recorder()
        write_all(f, memoryview(data[:n]))
        assert b"".join(f.pieces) == data[:n].tobytes()
        assert all(len(p) <= WRITE_PIECE for p in f.pieces) and len(f.pieces) == max(1, -(-n // WRITE_PIECE))


def test_pwrite_all_writes_in_pieces(tmp_path, monkeypatch):
    from gradtool.io.base import WRITE_PIECE, pwrite_all

    sizes = []
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, b, off: sizes.append(len(b)) or real(fd, b, off))
    data = os.urandom(2 * WRITE_PIECE + 3)
    fd = os.open(tmp_path / "out.bin", os.O_RDWR | os.O_CREAT)
    try:
        pwrite_all(fd, memoryview(data), 7)
    finally:
        os.close(fd)
    assert sizes == [WRITE_PIECE, WRITE_PIECE, 3]
    assert (tmp_path / "out.bin").read_bytes() == b"\0" * 7 + data


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "h5", "npz-compressed"])
def test_written_in_small_pieces_the_output_is_the_same(tmp_path, monkeypatch, fmt):
    """Save and clip with a piece of 1,000 bytes (not a multiple of an element): the same files."""
    import gradtool.io.base as base

    tensors = {"w": np.linspace(-3, 3, 70_007, dtype=np.float32).reshape(7, 10_001),
               "h": np.arange(5000, dtype=np.float16), "i": np.arange(777, dtype=np.int64)}
    ext = "npz" if fmt.startswith("npz") else fmt
    kw = {"compress": True} if fmt == "npz-compressed" else {}

    def save_and_clip(tag):
        src, out = tmp_path / f"{tag}.{ext}", tmp_path / f"{tag}_clipped.{ext}"
        save_dump(str(src), tensors, **kw)
        with open_dump(str(src)) as r, make_writer(str(out), "hdf5" if ext == "h5" else ext, r.metadata, **kw) as w:
            assert clip_dump(r, w, ClipSpec("global-norm", max=1.0)).scale < 1
        return src.read_bytes(), out.read_bytes()

    whole = save_and_clip("whole")
    monkeypatch.setattr(base, "WRITE_PIECE", 1000)
    assert save_and_clip("pieces") == whole


def test_hdf5_datasets_made_by_the_low_level_call_are_h5pys_byte_for_byte(tmp_path, monkeypatch):
    """The writer creates its contiguous datasets with h5py's low-level h5d.create (50 us a dataset less
    than group.create_dataset); the file is the one group.create_dataset makes, byte for byte: names
    ASCII and not, nested groups, dtypes (half, single, double, integers, booleans), shapes."""
    import h5py

    from gradtool.io.hdf5 import Hdf5Writer

    tensors = {"a/w": np.arange(12, dtype=np.float32).reshape(3, 4), "a/é": np.ones(5, np.float16),
               "b": np.arange(6, dtype=np.float32)[::-1].copy(), "i": np.arange(7, dtype=np.int64),
               "m": np.array([True, False]), "d": np.full((2, 2, 2), 0.5)}
    src = str(tmp_path / "src.h5")
    save_dump(src, tensors, {"step": 3})

    def clip_to(out):
        with open_dump(src) as reader, make_writer(out, "hdf5") as writer:
            clip_dump(reader, writer, ClipSpec(mode="global-norm", max=1.0).validate())

    clip_to(str(tmp_path / "low.h5"))

    def high_level(self, group, leaf, shape, dtype):
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
        ds = group.create_dataset(leaf, shape=shape, dtype=dtype, dcpl=dcpl)
        return ds, ds.id.get_offset()

    monkeypatch.setattr(Hdf5Writer, "_allocated_dataset", high_level)
    clip_to(str(tmp_path / "high.h5"))
    low, high = (tmp_path / "low.h5").read_bytes(), (tmp_path / "high.h5").read_bytes()
    assert low == high
    with open_dump(str(tmp_path / "low.h5")) as r:
        assert sorted(t.name for t in r.tensors) == sorted(tensors)
