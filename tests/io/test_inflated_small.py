"""Small deflated npz members inflated whole, many to a worker's job (``NpzReader.inflate_members``,
``summarize.inflated_small_stats``): the same statistics, bit for bit, as streaming each member through
``inflated_chunks``; a member that fails its checks is streamed, which reports it."""

import io
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import open_dump
from gradtool import summarize as summarize_mod
from gradtool.core import kernels
from gradtool.core.stats import STREAM_CHUNK
from gradtool.errors import InputError
from gradtool.io.npz import NpzReader
from gradtool.summarize import summarize_dump
from tests.small_members import whole_and_streamed

needs_kernel = pytest.mark.skipif(kernels.compiled_f32_summaries is None, reason="compiled kernel not built")


def _both(path, monkeypatch):
    return whole_and_streamed(path, monkeypatch, NpzReader)


def _model(rng, sizes, specials=True):
    t = {}
    for i, n in enumerate(sizes):
        dt = [np.float32, np.float16][i % 2]
        t[f"layer.{i}.w"] = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 2)).astype(dt)
    if specials and len(sizes) > 6:
        t["layer.1.w"][0] = np.nan
        t["layer.2.w"][-1] = -np.inf
        t["layer.3.w"][:] = 1e25 if t["layer.3.w"].dtype == np.float32 else 6e4  # squares overflow float32 / a float16's range
        t["layer.4.w"][:] = rng.standard_normal(t["layer.4.w"].size) * 1e-3 + 100  # mean dominates
        t["layer.5.w"][:] = 0.0
        t["layer.6.w"][:] = 1e-30
    t["f64"] = rng.standard_normal(300)  # not taken: streamed as before
    t["ints"] = np.arange(100, dtype=np.int32)
    t["empty"] = np.zeros(0, np.float32)
    t["two_chunks"] = rng.standard_normal(STREAM_CHUNK + 1).astype(np.float32)
    t["fortran"] = np.asfortranarray(rng.standard_normal((33, 70)).astype(np.float32))
    return t


@needs_kernel
def test_small_members_inflated_whole_equal_streamed(tmp_path, monkeypatch):
    t = _model(np.random.default_rng(1), [1, 7, 31, 32, 33, 4095, 4096, 4097, 70_000, STREAM_CHUNK] * 3)
    path = str(tmp_path / "c.npz")
    np.savez_compressed(path, **t)
    whole, streamed, got = _both(path, monkeypatch)
    assert [n for n, _ in whole.tensors] == list(t)
    assert [repr(s) for _, s in whole.tensors] == [repr(s) for _, s in streamed.tensors]
    taken = {k for k, v in t.items() if 0 < v.size <= STREAM_CHUNK and v.dtype.kind == "f" and v.itemsize < 8}
    assert set(got) == taken and len(got) == len(taken)
    # and against an independent float64 reference
    stats = dict(whole.tensors)
    for k in ("layer.0.w", "layer.8.w", "fortran"):
        x = t[k].astype(np.float64)
        assert stats[k].norm == pytest.approx(np.sqrt(np.sum(x * x)), rel=1e-6)
        assert stats[k].max_abs == np.max(np.abs(x))


@needs_kernel
@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, STREAM_CHUNK + 1), min_size=1, max_size=12), seed=st.integers(0, 2**32 - 1),
       job=st.integers(1, 1 << 18))
def test_any_small_members_in_any_jobs_equal_streamed(tmp_path_factory, sizes, seed, job):
    """Members across the one-chunk boundary, in jobs of any size (so members split across jobs)."""
    path = str(tmp_path_factory.mktemp("h") / "c.npz")
    np.savez_compressed(path, **_model(np.random.default_rng(seed), sizes))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(summarize_mod, "SMALL_MEMBER_JOB_BYTES", job)
        whole, streamed, _ = _both(path, m)
    assert [repr(s) for _, s in whole.tensors] == [repr(s) for _, s in streamed.tensors]


def _npy(a):
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


def test_inflate_members_gives_each_deflated_members_data_and_none_for_the_rest(tmp_path):
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(n).astype(np.float32) for n in (10, 3000, 1))
    path = str(tmp_path / "mixed.npz")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(zipfile.ZipInfo("a.npy"), _npy(a), compress_type=zipfile.ZIP_DEFLATED)
        z.writestr(zipfile.ZipInfo("b.npy"), _npy(b), compress_type=zipfile.ZIP_STORED)
        z.writestr(zipfile.ZipInfo("c.npy"), _npy(c), compress_type=zipfile.ZIP_DEFLATED)
    with open_dump(path) as reader:
        got = reader.inflate_members(reader.tensors)
        assert bytes(got[0]) == a.tobytes() and got[1] is None and bytes(got[2]) == c.tobytes()
        assert bytes(reader.inflate_members([reader.tensors[2]])[0]) == c.tobytes()


@pytest.mark.parametrize("where", ["crc", "stream"])
def test_a_damaged_small_member_is_reported_with_the_file_named(tmp_path, where):
    rng = np.random.default_rng(3)
    t = {f"t{i}": rng.standard_normal(2000).astype(np.float32) for i in range(50)}
    path = str(tmp_path / "bad.npz")
    np.savez_compressed(path, **t)
    raw = bytearray(open(path, "rb").read())
    with zipfile.ZipFile(path) as z:
        zi = z.getinfo("t20.npy")
    if where == "crc":  # the CRC-32 in the central directory: only the inflated bytes can tell
        cd = raw.find(b"t20.npy", raw.find(b"PK\x01\x02")) - 46
        raw[cd + 16] ^= 0xFF
    else:  # inside the member's deflate stream, past its .npy header
        raw[zi.header_offset + 30 + len("t20.npy") + zi.compress_size // 2] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    with open_dump(path) as reader:
        with pytest.raises(InputError, match=r"bad.npz: member 't20.npy' is corrupt"):
            summarize_dump(reader)
        assert reader.inflate_members([i for i in reader.tensors if i.name == "t20"]) == [None]


@needs_kernel
def test_clip_of_a_run_whose_member_would_not_inflate_clips_it_one_at_a_time(tmp_path, monkeypatch):
    """``clip`` inflates small deflated members a run at a time (``clip_dump._run_bytes``); where
    ``inflate_members`` gives None for one (a member it cannot take: the stream reports the damage), the
    run's tensors are clipped one at a time instead: the same report and the same output file."""
    import dataclasses

    from gradtool import clip_dump as clip_mod
    from gradtool.clip_dump import ClipSpec, clip_dump
    from gradtool.io.dump import make_writer

    rng = np.random.default_rng(5)
    t = {f"t{i}": rng.standard_normal(int(rng.integers(1, 3000))).astype(np.float32) for i in range(300)}
    src = str(tmp_path / "in.npz")
    np.savez_compressed(src, **t)
    real = NpzReader.inflate_members
    runs = []

    def refusing(self, infos, *rest):
        got = real(self, infos, *rest)
        return [None if i.name == "t120" else g for i, g in zip(infos, got)]

    def clipped(out):
        with open_dump(src) as r, make_writer(out, "npz", r.metadata, compress=True) as w:
            rep = clip_dump(r, w, ClipSpec(mode="global-norm", max=1.0))
        return [dataclasses.astuple(c) for c in rep.tensors], open(out, "rb").read()

    clip_run = clip_mod._clip_run
    monkeypatch.setattr(clip_mod, "_clip_run", lambda *a, **k: runs.append(a[1]) or clip_run(*a, **k))
    with monkeypatch.context() as m:
        m.setattr(NpzReader, "inflate_members", refusing)
        one_refused = clipped(str(tmp_path / "a.npz"))
    assert any(run.fd < 0 for run in runs)
    with monkeypatch.context() as m:
        m.setattr(clip_mod, "_small_runs", lambda *a, **k: {})
        assert one_refused == clipped(str(tmp_path / "b.npz"))
    assert one_refused == clipped(str(tmp_path / "c.npz"))  # (and as every run inflated)
    scale = np.float32(one_refused[0][0][2] / one_refused[0][0][1])  # (norm after / before: the scale)
    with np.load(str(tmp_path / "a.npz")) as z:
        np.testing.assert_allclose(z["t120"], t["t120"] * scale, rtol=1e-6)
