"""WorkAhead: a tensor's chunks read and worked on by a worker thread ahead of the caller give the chunks
and results the serial loop gives, in order, across chunk boundaries; errors reach the caller; a caller
that stops early, or a worker busy with another caller, leaves nothing stuck."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtool.clip_dump as clip_module
from gradtool import open_dump, save_dump
from gradtool.clip_dump import ClipSpec, clip_dump
from gradtool.core.stats import STREAM_CHUNK
from gradtool.errors import InputError
from gradtool.io import base
from gradtool.io.base import TensorInfo, WorkAhead
from gradtool.io.dump import make_writer


def _fill_from(fd: int, offset: int, nbytes: int):
    """WorkAhead's ``fill``: the bytes from ``offset + at`` of ``fd``, the file being ``nbytes`` long (a
    reader's: it names the file when it ends early)."""
    info = TensorInfo("t", (nbytes,), np.dtype(np.uint8))

    class Raw:
        display_path = "raw.bin"
        _fill = base.DumpReader._fill

    return lambda view, at: Raw()._fill(view, lambda v, pos: os.preadv(fd, [v], offset + at + pos), info)


def _file(tmp_path, data: np.ndarray, offset: int):
    p = tmp_path / "raw.bin"
    p.write_bytes(b"\x07" * offset + data.tobytes())
    return os.open(p, os.O_RDONLY)


def _doubled(raw: np.ndarray) -> float:
    """The work: the chunk's float32 values doubled in place; their float64 sum of squares before, as the
    result."""
    chunk = raw.view(np.float32)
    before = float(np.sum(np.square(chunk.astype(np.float64))))
    chunk *= 2
    return before


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 300), chunk=st.integers(1, 70), offset=st.integers(0, 100), depth=st.integers(1, 4),
       phase=st.sampled_from([0, 64, 4032]), seed=st.integers(0, 2**32 - 1))
def test_the_same_chunks_and_results_as_the_serial_loop(tmp_path_factory, n, chunk, offset, depth, phase, seed):
    data = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    fd = _file(tmp_path_factory.mktemp("w"), data, offset)
    try:
        got, results = [], []
        for c, r in WorkAhead(depth).chunks(_fill_from(fd, offset, 4 * n), 4 * n, 4 * chunk, phase, _doubled):
            assert c.dtype == np.uint8 and c.shape[0] == 4 * min(chunk, n - chunk * len(got))
            got.append(c.view(np.float32).copy())
            results.append(r)
    finally:
        os.close(fd)
    pieces = [data[i: i + chunk] for i in range(0, n, chunk)]
    assert results == [float(np.sum(np.square(p.astype(np.float64)))) for p in pieces]
    assert np.array_equal(np.concatenate(got) if got else np.empty(0, np.float32), data * 2)
    assert not base._WORK_AHEAD_FREE.locked()


def test_a_caller_that_stops_early_frees_the_worker(tmp_path):
    data = np.arange(1000, dtype=np.float32)
    fd = _file(tmp_path, data, 0)
    try:
        seen = []
        fill = _fill_from(fd, 0, data.nbytes)
        gen = WorkAhead().chunks(fill, data.nbytes, 40, 0, lambda c: seen.append(c.view(np.float32)[0]) or 0)
        first, _ = next(gen)
        assert first.view(np.float32)[0] == 0
        gen.close()
        assert not base._WORK_AHEAD_FREE.locked()
        assert len(seen) <= 1 + base.READ_AHEAD  # it stopped: not the 100 chunks
        again = [c.copy() for c, r in WorkAhead().chunks(fill, data.nbytes, 1200, 0) if r is None]
        assert np.array_equal(np.concatenate(again).view(np.float32), data)
    finally:
        os.close(fd)


@pytest.mark.parametrize("what", ["truncated", "work"])
def test_errors_reach_the_caller(tmp_path, what):
    data = np.arange(1000, dtype=np.float32)
    fd = _file(tmp_path, data, 0)
    nbytes = 2 * data.nbytes if what == "truncated" else data.nbytes

    def work(c):
        if what == "work" and c.view(np.float32)[0] >= 500:
            raise ValueError("the work failed")

    try:
        with pytest.raises(InputError if what == "truncated" else ValueError,
                           match="raw.bin: tensor 't' is truncated" if what == "truncated" else "work failed"):
            for _ in WorkAhead().chunks(_fill_from(fd, 0, nbytes), nbytes, 400, 0, work):
                pass
    finally:
        os.close(fd)
    assert not base._WORK_AHEAD_FREE.locked()


def test_while_the_worker_serves_another_the_chunks_are_made_here(tmp_path, monkeypatch):
    """A second generator of the same WorkAhead opened while the first holds the worker (and its slots):
    made on the caller's thread, in a buffer of its own; both give their chunks."""
    a = np.random.default_rng(1).standard_normal(777).astype(np.float32)
    b = np.random.default_rng(2).standard_normal(555).astype(np.float32)
    fd = _file(tmp_path, np.concatenate([a, b]), 12)
    submitted = []
    real = base._work_ahead_thread
    monkeypatch.setattr(base, "_work_ahead_thread", lambda: submitted.append(1) or real())
    w = WorkAhead()
    try:
        first = w.chunks(_fill_from(fd, 12, a.nbytes), a.nbytes, 400, 64, _doubled)
        held = next(first)[0]  # valid until the next is asked for: through the second generator too
        got_b = [(c.view(np.float32).copy(), r)
                 for c, r in w.chunks(_fill_from(fd, 12 + a.nbytes, b.nbytes), b.nbytes, 400, 64, _doubled)]
        got_a = [c.view(np.float32).copy() for c in [held]] + [c.view(np.float32).copy() for c, _ in first]
    finally:
        os.close(fd)
    assert submitted == [1]  # the first only
    assert np.array_equal(np.concatenate(got_a), a * 2)
    assert np.array_equal(np.concatenate([c for c, _ in got_b]), b * 2)
    assert [r for _, r in got_b] == [float(np.sum(np.square(b[i: i + 100].astype(np.float64))))
                                     for i in range(0, 555, 100)]
    assert not base._WORK_AHEAD_FREE.locked()


@pytest.mark.parametrize("ext", ["safetensors", "npz", "h5"])
@pytest.mark.parametrize("mode,dtype", [("global-norm", np.float32), ("norm", np.float32),
                                        ("global-norm", np.float16), ("value", np.float32),
                                        ("value", np.float16)])
def test_clip_writes_the_same_bytes_with_and_without_it(tmp_path, monkeypatch, ext, mode, dtype):
    """Tensors of several chunks (2.5 and 1 + 1 element), of one, and small ones: the output and the report
    are the serial path's, and the tensors of several chunks went through WorkAhead."""
    from gradtool.core import kernels

    if kernels.compiled_f32_scale is None or kernels.compiled_half_scale is None:
        pytest.skip("the scaling that WorkAhead carries is the compiled kernel's")
    rng = np.random.default_rng(5)
    t = {"big": rng.standard_normal((5, STREAM_CHUNK // 2)).astype(dtype),
         "edge": rng.standard_normal(STREAM_CHUNK + 1).astype(dtype),
         "one": rng.standard_normal(STREAM_CHUNK).astype(dtype),
         "small": rng.standard_normal(10).astype(dtype)}
    src = tmp_path / f"src.{ext}"
    save_dump(str(src), t)
    used = []
    real = WorkAhead.chunks

    def spy(self, fill, nbytes, *a, **k):
        used.append(nbytes)
        return real(self, fill, nbytes, *a, **k)

    def clipped(name: str) -> tuple[bytes, list]:
        out = tmp_path / f"{name}.{ext}"
        with open_dump(str(src)) as r, make_writer(str(out), "hdf5" if ext == "h5" else ext, r.metadata) as w:
            rep = clip_dump(r, w, ClipSpec(mode, max=1.0))
        return out.read_bytes(), [(c.name, c.norm_before, c.norm_after, c.clipped_elements) for c in rep.tensors]

    monkeypatch.setattr(WorkAhead, "chunks", spy)
    ahead = clipped("ahead")
    assert sorted(used) == sorted([t["big"].nbytes, t["edge"].nbytes])
    monkeypatch.setattr(clip_module, "WorkAhead", lambda: None)
    used.clear()
    serial = clipped("serial")
    assert not used
    assert ahead == serial
    with open_dump(str(tmp_path / f"ahead.{ext}")) as r:
        assert r.read("big").dtype == dtype and r.read("big").shape == t["big"].shape


@pytest.mark.parametrize("policy", ["error", "propagate"])
def test_a_chunk_found_nonfinite_while_clipped_ahead_is_refused_under_error(tmp_path, monkeypatch, policy):
    """(The tensor measured finite before it is clipped: NaN found then means the file changed since.)"""
    from gradtool.core import kernels
    from gradtool.errors import NonFiniteError

    if kernels.compiled_clip_values is None:
        pytest.skip("the clipping that WorkAhead carries is the compiled kernel's")
    real = clip_module._fused_clip_values

    def seeing_nan(*a):
        kernel = real(*a)
        return lambda chunk, out: (kernel(chunk, out)[0], 1)

    monkeypatch.setattr(clip_module, "_fused_clip_values", seeing_nan)
    src = tmp_path / "src.safetensors"
    save_dump(str(src), {"big": np.linspace(-3, 3, 2 * STREAM_CHUNK + 5, dtype=np.float32)})
    with open_dump(str(src)) as r, make_writer(str(tmp_path / "out.safetensors"), "safetensors", r.metadata) as w:
        if policy == "error":
            with pytest.raises(NonFiniteError, match="big.*nothing written"):
                clip_dump(r, w, ClipSpec("value", max=1.0, nonfinite=policy))
        else:
            rep = clip_dump(r, w, ClipSpec("value", max=1.0, nonfinite=policy))
            assert rep.tensors[0].clipped_elements == int(np.sum(np.abs(r.read("big")) > 1))
