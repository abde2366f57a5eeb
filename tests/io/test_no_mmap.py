"""A file system that refuses memory maps (some FUSE and network mounts): every reader falls back to
``pread`` and gives the same answers; no traceback."""

import mmap

import numpy as np
import pytest

from gradtool import open_dump, save_dump

# large enough (> PREAD_BELOW_BYTES) that the aligned readers would map them
TENSORS = {
    "w": np.linspace(-3, 3, 400_000, dtype=np.float32).reshape(400, 1000),
    "d": np.linspace(-1, 2, 70_000, dtype=np.float64),
    "h": np.linspace(-5, 5, 200_000).astype(np.float16),
    "b": np.arange(7, dtype=np.float32),
}


def refuse_mmap(monkeypatch):
    """mmap.mmap raising as such a file system does (ENODEV); returns the list of refused calls."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise OSError(19, "No such device")

    monkeypatch.setattr(mmap, "mmap", refuse)
    return calls


@pytest.mark.parametrize("ext", ["npz", "h5", "safetensors"])
def test_stats_and_clip_give_the_same_answers_without_mmap(tmp_path, run, monkeypatch, ext):
    p = str(tmp_path / f"d.{ext}")
    save_dump(p, TENSORS)
    want = run("stats", p, "--format", "json")
    assert want.exit_code == 0, want.stderr
    run("clip", p, "-o", str(tmp_path / f"want.{ext}"), "--mode", "global-norm", "--max", "1")

    calls = refuse_mmap(monkeypatch)
    got = run("stats", p, "--format", "json")
    assert got.exit_code == 0, got.stderr
    assert got.json() == want.json()
    clipped = run("clip", p, "-o", str(tmp_path / f"got.{ext}"), "--mode", "global-norm", "--max", "1")
    assert clipped.exit_code == 0, clipped.stderr
    assert calls, "the readers never tried to map the file: the test no longer tests the fallback"
    monkeypatch.undo()
    with open_dump(str(tmp_path / f"want.{ext}")) as a, open_dump(str(tmp_path / f"got.{ext}")) as b:
        assert a.names == b.names
        for name in a.names:
            assert np.array_equal(a.read(name), b.read(name)), name


def test_range_windows_read_without_mmap_are_the_data(tmp_path, monkeypatch):
    refused = refuse_mmap(monkeypatch)
    p = str(tmp_path / "d.safetensors")
    save_dump(p, TENSORS)
    with open_dump(p) as r:
        for name, array in TENSORS.items():
            info = r.info(name)
            location = r.raw_location(info)
            assert location is not None
            for start, stop in [(0, info.size), (1, info.size - 1), (info.size // 3, info.size // 2)]:
                (window,) = list(r.range_window(location, info, start, stop))
                assert np.array_equal(window, array.reshape(-1)[start:stop]), (name, start, stop)
    assert refused
