"""Opening a dump reads only its index; tensors are read one at a time, on access."""

import numpy as np
import pytest

from gradtool import open_dump, save_dump
from gradtool.io import base


@pytest.mark.parametrize("ext", ["npz", "h5", "safetensors"])
def test_only_one_tensor_resident(tmp_path, ext, monkeypatch):
    p = str(tmp_path / f"big.{ext}")
    save_dump(p, {f"t{i}": np.full(10_000, i, np.float32) for i in range(5)})
    allocations = []
    real = base.allocate
    import gradtool.io.hdf5 as h5mod
    import gradtool.io.npy as npymod
    import gradtool.io.npz as npzmod

    def spy(info, path, **placement):
        allocations.append(info.name)
        return real(info, path, **placement)

    for mod in (base, npymod, npzmod, h5mod):  # where allocate is called (base: DumpReader._read_at)
        monkeypatch.setattr(mod, "allocate", spy)
    with open_dump(p) as r:
        assert allocations == []  # opening read the index only
        import weakref

        alive = []
        for info, a in r.iter_tensors():
            alive.append(weakref.ref(a) if hasattr(a, "__weakref__") else None)
            assert a[0] == int(info.name[1:])
            del a
            # every earlier array has been released: at most the current one is resident
            assert sum(1 for w in alive[:-1] if w is not None and w() is not None) == 0
        assert allocations == [f"t{i}" for i in range(5)]


def _npz_with_every_header_size(tmp_path):
    """np.savez and gradtool npz files of tensors from empty to large, one with a Fortran-order member and
    a long name (its header and local header longer)."""
    arrays = {"empty": np.zeros(0, np.float32), "one": np.float64(2.5) * np.ones(()), "b": np.arange(3, dtype=np.int8),
              "w" * 200: np.arange(24, dtype=np.float16).reshape(2, 3, 4),
              "f": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
              "big": np.linspace(-1, 1, 70_000, dtype=np.float32).reshape(7, 10_000)}
    np.savez(tmp_path / "np.npz", **arrays)
    save_dump(str(tmp_path / "gt.npz"), arrays)
    return arrays, [str(tmp_path / "np.npz"), str(tmp_path / "gt.npz")]


def test_opening_a_stored_npz_reads_each_member_once(tmp_path, monkeypatch):
    """One pread a member while indexing (its local header and its .npy header together), not four."""
    import os

    _, paths = _npz_with_every_header_size(tmp_path)
    reads = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: reads.append(n) or real(fd, n, off))
    for p in paths:
        reads.clear()
        with open_dump(p) as r:
            assert len(r.tensors) == 6 and len(reads) == 6


@pytest.mark.parametrize("lookahead", [0, 1, 9, 11, 40, 90, 127, 200, 512, 4096])
def test_npz_index_is_the_same_whatever_was_read_ahead(tmp_path, monkeypatch, lookahead):
    """Headers read ahead in part, whole, or not at all (then by further preads): the same tensors."""
    import gradtool.io.npz as npzmod

    arrays, paths = _npz_with_every_header_size(tmp_path)
    monkeypatch.setattr(npzmod, "HEADER_LOOKAHEAD", lookahead)
    for p in paths:
        with open_dump(p) as r:
            got = {info.name: a for info, a in r.iter_tensors()}
            assert [(t.name, t.shape, t.dtype) for t in r.tensors] == [
                (k, v.shape, v.dtype) for k, v in arrays.items()]
        for k, v in arrays.items():
            np.testing.assert_array_equal(got[k], v, strict=True)


def test_info_finds_tensors_by_an_index_not_a_scan(tmp_path):
    """reader.info(name) for every tensor of a dump was a scan each: clip of 20,000 tensors spent 11 s
    there. The index follows the list when it grows or is replaced; a missing name is a KeyError."""
    p = str(tmp_path / "d.safetensors")
    save_dump(p, {f"t{i}": np.full(3, i, np.float32) for i in range(50)})

    class Counting(list):
        scans = 0

        def __iter__(self):
            Counting.scans += 1
            return super().__iter__()

    with open_dump(p) as r:
        r.tensors = Counting(r.tensors)
        assert [r.info(f"t{i}").name for i in range(50)] == [f"t{i}" for i in range(50)]
        assert Counting.scans == 1  # one pass to build the index, none per lookup
        with pytest.raises(KeyError):
            r.info("nope")
        extra = base.TensorInfo("extra", (1,), np.dtype(np.float32))
        r.tensors.append(extra)
        assert r.info("extra") is extra
        r.tensors = [extra]
        assert r.info("extra") is extra
        with pytest.raises(KeyError):
            r.info("t0")
