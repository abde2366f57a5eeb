"""Statistics of one dump on two threads (pieces of tensors read at their file offsets, merged in order)
equal the single-thread streamed statistics: the same norms to the bit, the same counts and extremes,
mean and std to rounding; errors still name the file."""

import contextlib
import math
import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import open_dump, save_dump
from gradtool import summarize as summarize_mod
from gradtool.core import kernels
from gradtool.core.stats import STREAM_CHUNK, StatsAccumulator
from gradtool.errors import InputError
from gradtool.summarize import summarize_dump


def _tensors():
    rng = np.random.default_rng(7)
    t = {
        "big": rng.standard_normal(3 * STREAM_CHUNK + 12_345).astype(np.float32),
        "f64": rng.standard_normal((700, 1100)),
        "half": rng.standard_normal(STREAM_CHUNK + 5).astype(np.float16),
        "bad": rng.standard_normal(2 * STREAM_CHUNK).astype(np.float32),
        "ints": rng.integers(-5, 5, 100_000).astype(np.int32),
        "mask": rng.random(50_001) < 0.5,
        "empty": np.zeros((0, 4), np.float32),
        "tiny": np.array([1.0, -2.0, 0.0], np.float32),
        "huge": (rng.standard_normal(STREAM_CHUNK + 1) * 1e25).astype(np.float32),
        # pieces under SMALL_PIECE_ELEMENTS are summarised inline: a big tensor's short last piece, small
        # tensors of other dtypes, one with a NaN
        "tail": rng.standard_normal(2 * STREAM_CHUNK + 100).astype(np.float32),
        "small64": rng.standard_normal((30, 33)),
        "small16": rng.standard_normal(777).astype(np.float16),
        "smallnan": np.array([np.nan, 1.0, -np.inf, 3.0], np.float32),
        "smallint": rng.integers(-9, 9, 4095).astype(np.int64),
    }
    t["bad"][[5, STREAM_CHUNK + 9]] = [np.nan, np.inf]
    return t


def _summaries(path, workers, **kw):
    saved = (summarize_mod.STATS_WORKERS, summarize_mod.PARALLEL_MIN_BYTES, summarize_mod.PIECE_BYTES)
    summarize_mod.STATS_WORKERS, summarize_mod.PARALLEL_MIN_BYTES = workers, 0
    summarize_mod.PIECE_BYTES = 2 * STREAM_CHUNK * 4  # several pieces per big tensor
    try:
        with open_dump(path) as reader:
            return summarize_dump(reader, **kw)
    finally:
        summarize_mod.STATS_WORKERS, summarize_mod.PARALLEL_MIN_BYTES, summarize_mod.PIECE_BYTES = saved


def _save(path, tensors, ext):
    """gradtool's writer, or ``np.savez`` for "numpy.npz" (members at unaligned offsets: read with pread)."""
    if ext == "numpy.npz":
        np.savez(path, **tensors)
    else:
        save_dump(path, tensors)


def _same(par, ser):
    assert [n for n, _ in par.tensors] == [n for n, _ in ser.tensors]
    for (name, a), (_, b) in zip(par.tensors, ser.tensors):
        a, b = a.as_dict(), b.as_dict()
        for key in a:
            if key in ("mean", "std") and a[key] is not None and math.isfinite(a[key]):
                assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-15), (name, key)
            else:
                assert repr(a[key]) == repr(b[key]), (name, key)


@pytest.mark.parametrize("ext", ["npz", "safetensors", "h5", "numpy.npz"])
@pytest.mark.parametrize("kernel", [True, False])
def test_two_threads_equal_one(tmp_path, ext, kernel):
    if kernel and not kernels.BUILT:
        pytest.skip("compiled kernel not built")
    t = _tensors()
    path = str(tmp_path / f"d.{ext}")
    _save(path, t, ext)
    threads = set()
    piece_accumulator = summarize_mod._piece_accumulator

    def recording(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return piece_accumulator(*args, **kwargs)

    with contextlib.nullcontext() if kernel else kernels.disabled(), pytest.MonkeyPatch.context() as m:
        m.setattr(summarize_mod, "_piece_accumulator", recording)
        calls = []
        par = _summaries(path, 2, on_tensor=calls.append)
        assert any(name.startswith("gradtool-stats") for name in threads)  # the two-thread path ran
        ser = _summaries(path, 1)
    _same(par, ser)
    assert len(calls) == len(t)  # the progress callback still fires once per tensor


@pytest.mark.parametrize("ext", ["npz", "safetensors", "h5", "numpy.npz"])
@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 31, 4095, 4096, 70_000, STREAM_CHUNK, STREAM_CHUNK + 1]),
                      min_size=1, max_size=6),
       seed=st.integers(0, 2**32 - 1), special=st.sampled_from([None, np.nan, -np.inf, 0.0, 1e30, 1e-30]),
       mean=st.sampled_from([0.0, 100.0]))
def test_one_thread_reads_float32_tensors_in_the_kernel_with_the_chunk_readers_bits(
        tmp_path_factory, ext, sizes, seed, special, mean):
    """One thread summarises a float32 tensor of up to STREAM_CHUNK elements at a file offset with one
    kernel call (pread and summary in C): the same statistics, bit for bit, as reading its chunks in Python
    (``iter_chunks``) and summarising each, across chunk and row boundaries, with NaN/inf, values whose
    float32 squares overflow or underflow (the exact path) and a mean that dominates (recentred)."""
    if not kernels.BUILT or kernels.compiled_f32_summaries_fd is None:
        pytest.skip("compiled kernel not built")
    from gradtool.summarize import chunks_stats, streamed_stats

    rng = np.random.default_rng(seed)
    t = {f"t{k}": (rng.standard_normal(n) + mean).astype(np.float32) for k, n in enumerate(sizes)}
    for a in t.values():
        if a.size and special is not None:
            a[rng.integers(a.size)] = special
    path = str(tmp_path_factory.mktemp("d") / f"d.{ext}")
    _save(path, t, ext)
    calls = []
    real = kernels.compiled_f32_summaries_fd
    with open_dump(path) as reader, pytest.MonkeyPatch.context() as m:
        m.setattr(kernels, "compiled_f32_summaries_fd", lambda *a: calls.append(a[2]) or real(*a))
        for info in reader.tensors:
            fast = streamed_stats(reader, info)
            simple = chunks_stats(reader.iter_chunks(info, STREAM_CHUNK), info)
            assert repr(fast) == repr(simple), info.name
    assert sorted(calls) == sorted(n for n in sizes if 0 < n <= STREAM_CHUNK)  # one kernel call a tensor


def test_selection_and_the_empty_tensor_order(tmp_path):
    path = str(tmp_path / "d.safetensors")
    save_dump(path, _tensors())
    par = _summaries(path, 2, select=("*a*", "empty", "tiny"), exclude=("half",))
    ser = _summaries(path, 1, select=("*a*", "empty", "tiny"), exclude=("half",))
    _same(par, ser)
    assert [n for n, _ in par.tensors] == ["bad", "mask", "empty", "tiny", "tail", "small64", "small16",
                                          "smallnan", "smallint"]


def test_a_truncated_dump_still_fails_with_the_file_named(tmp_path):
    path = str(tmp_path / "d.safetensors")
    save_dump(path, {"a": np.ones(3 * STREAM_CHUNK, np.float32), "b": np.ones(10, np.float32)})
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(InputError, match="d.safetensors"):
        _summaries(path, 2)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 5 * 4096 + 33), chunk=st.sampled_from([4096, 8192, 5000]), seed=st.integers(0, 2**32 - 1),
       special=st.sampled_from([None, np.nan, np.inf, 0.0, 1e30]))
def test_update_window_equals_update_chunk_by_chunk(n, chunk, seed, special):
    a = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    if n and special is not None:
        a[n // 2] = special
    w, c = StatsAccumulator(), StatsAccumulator()
    w.update_window(a, chunk)
    for s in range(0, n, chunk):
        c.update(a[s:s + chunk])
    shape = (n,)
    assert repr(w.result(shape, "float32", True)) == repr(c.result(shape, "float32", True))


@pytest.mark.parametrize("slack", [0, 64 << 20])
def test_compressed_members_on_two_threads_equal_the_stored_dump(tmp_path, slack):
    """Deflated members are inflated (largest first, within the memory budget) and summarised on two
    threads; the summary is in file order and equal to the same dump stored uncompressed."""
    t = _tensors()
    stored, packed = str(tmp_path / "s.npz"), str(tmp_path / "c.npz")
    np.savez(stored, **t)
    np.savez_compressed(packed, **t)
    saved = summarize_mod.DECOMPRESS_SLACK
    summarize_mod.DECOMPRESS_SLACK = slack  # 0: only the largest tensor's worth in flight (workers wait)
    try:
        calls = []
        with open_dump(packed) as reader:
            assert reader.compressed
            par = summarize_dump(reader, on_tensor=calls.append)
    finally:
        summarize_mod.DECOMPRESS_SLACK = saved
    ser = _summaries(stored, 1)
    _same(par, ser)
    assert [n for n, _ in par.tensors] == list(t) and len(calls) == len(t)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 5000), st.integers(0, 3 << 20)), max_size=3000))
def test_compressed_members_go_to_the_workers_largest_first_the_small_ones_together(sizes):
    """_member_jobs gives every member once: those of SMALL_MEMBER_JOB_BYTES or more a job each, largest
    first, then the small ones, still largest first, together up to that many bytes (or 1,024) a job,
    each job full enough that the next member did not fit (next fit: at most twice the fewest jobs)."""
    from gradtool.summarize import SMALL_MEMBER_JOB_BYTES, _member_jobs

    jobs = _member_jobs(sizes)
    flat = [k for job in jobs for k in job]
    assert sorted(flat) == list(range(len(sizes)))
    assert [sizes[k] for k in flat] == sorted(sizes, reverse=True)
    for job, after in zip(jobs, jobs[1:] + [None]):
        if len(job) > 1:
            assert sum(sizes[k] for k in job) <= SMALL_MEMBER_JOB_BYTES and len(job) <= 1024
        if after is not None:
            assert len(job) == 1024 or sum(sizes[k] for k in job) + sizes[after[0]] > SMALL_MEMBER_JOB_BYTES
    small = [k for k in flat if sizes[k] < SMALL_MEMBER_JOB_BYTES]
    assert len([j for j in jobs if sizes[j[0]] < SMALL_MEMBER_JOB_BYTES]) <= (
        2 * sum(sizes[k] for k in small) // SMALL_MEMBER_JOB_BYTES + len(small) // 1024 + 2)


def test_many_tiny_compressed_members_are_summarised_in_file_order(tmp_path):
    """3,000 deflated members of a few elements (the workers take them many a job) are summarised in
    file order, each as the same dump stored uncompressed gives it."""
    rng = np.random.default_rng(3)
    t = {f"t{i}": rng.standard_normal(int(rng.integers(0, 40))).astype(np.float32) for i in range(3000)}
    stored, packed = str(tmp_path / "s.npz"), str(tmp_path / "c.npz")
    np.savez(stored, **t)
    np.savez_compressed(packed, **t)
    calls = []
    with open_dump(packed) as reader:
        par = summarize_dump(reader, on_tensor=calls.append)
    _same(par, _summaries(stored, 1))
    assert [n for n, _ in par.tensors] == list(t) and len(calls) == len(t)


def test_inflating_in_pieces_checks_size_and_crc(tmp_path, monkeypatch):
    from gradtool.io.npz import NpzReader

    monkeypatch.setattr(NpzReader, "INFLATE_PIECE", 1000)  # many pieces, header split across them
    a = np.random.default_rng(0).standard_normal(50_000)
    path = str(tmp_path / "c.npz")
    np.savez_compressed(path, a=a)
    with open_dump(path) as reader:
        assert np.array_equal(reader.read("a"), a)
    raw = bytearray(open(path, "rb").read())
    raw[200] ^= 0xFF  # inside the deflated stream
    bad = str(tmp_path / "bad.npz")
    open(bad, "wb").write(bytes(raw))
    with pytest.raises(InputError, match="bad.npz"):
        with open_dump(bad) as reader:
            reader.read("a")


def test_a_sharded_step_on_two_threads_equals_one(tmp_path):
    """A sharded step's logical tensors are their pieces in the rank files, in order, on two threads."""
    from gradtool.io.sharded import ShardedReader

    t = _tensors()
    paths = []
    for r, ext in enumerate(("safetensors", "npz", "h5")):
        piece = {name: np.array_split(a.reshape(-1), 3)[r] for name, a in t.items()}
        paths.append(str(tmp_path / f"rank{r}.{ext}"))
        save_dump(paths[-1], piece)
    saved = (summarize_mod.STATS_WORKERS, summarize_mod.PARALLEL_MIN_BYTES, summarize_mod.PIECE_BYTES)
    results = []
    try:
        for workers in (2, 1):
            summarize_mod.STATS_WORKERS, summarize_mod.PARALLEL_MIN_BYTES = workers, 0
            summarize_mod.PIECE_BYTES = 2 * STREAM_CHUNK * 4
            reader = ShardedReader(paths, display_path=str(tmp_path))
            try:
                assert reader.raw_segments(reader.info("big")) is not None  # the two-thread path applies
                results.append(summarize_dump(reader))
            finally:
                reader.close()
    finally:
        summarize_mod.STATS_WORKERS, summarize_mod.PARALLEL_MIN_BYTES, summarize_mod.PIECE_BYTES = saved
    _same(*results)
    assert dict(results[0].tensors)["big"].size == t["big"].size


@pytest.mark.parametrize("window_bytes", [1, 8 << 20])  # 1: one STREAM_CHUNK per window
def test_compressed_members_stream_through_a_window(tmp_path, monkeypatch, window_bytes):
    """Deflated members are summarised a window at a time, never read whole (so memory does not grow
    with the tensor), with the same statistics as the stored dump (which streams in file order too, a
    Fortran-order member included), across window, chunk and inflate-piece boundaries."""
    from gradtool.io.npz import NpzReader

    t = _tensors()
    t["fortran"] = np.asfortranarray(np.random.default_rng(1).standard_normal((300, 1000)).astype(np.float32))
    t["big_endian"] = np.random.default_rng(2).standard_normal(STREAM_CHUNK + 77).astype(">f4")
    stored, packed = str(tmp_path / "s.npz"), str(tmp_path / "c.npz")
    np.savez(stored, **t)
    np.savez_compressed(packed, **t)
    ser = _summaries(stored, 1)
    read_whole = []
    real_read = NpzReader._read
    monkeypatch.setattr(NpzReader, "_read", lambda self, info: read_whole.append(info.name) or real_read(self, info))
    monkeypatch.setattr(NpzReader, "INFLATE_PIECE", 1000)
    monkeypatch.setattr(summarize_mod, "INFLATE_WINDOW_BYTES", window_bytes)
    with open_dump(packed) as reader:
        assert reader.compressed
        par = summarize_dump(reader)
    _same(par, ser)
    assert read_whole == []


def test_a_corrupt_streamed_member_fails_with_the_file_named(tmp_path):
    p = str(tmp_path / "c.npz")
    np.savez_compressed(p, a=np.random.default_rng(0).standard_normal(3 * STREAM_CHUNK).astype(np.float32))
    raw = bytearray(open(p, "rb").read())
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 16] ^= 0xFF  # the CRC-32 in the central directory: only the end of the stream can tell
    open(p, "wb").write(bytes(raw))
    with open_dump(p) as reader:
        with pytest.raises(InputError, match=r"c.npz: member 'a.npy' is corrupt \(size or CRC-32 mismatch\)"):
            summarize_dump(reader)


@pytest.mark.parametrize("ext", ["npz", "safetensors", "h5", "numpy.npz"])
@pytest.mark.parametrize("workers", [1, 2])
def test_half_precision_dumps_read_in_the_kernel_give_their_float32_values_stats(tmp_path, ext, workers):
    """float16 (and, in safetensors, bfloat16) tensors at file offsets are read and summarised in C,
    widened to float32 as they are loaded, on one thread and on two: every statistic equals that of the
    same values stored as float32 (the path that widened them in NumPy before), bit for bit, across chunk,
    piece and row boundaries, with NaN/inf, subnormals and a dominating mean; only the dtype differs."""
    import ml_dtypes

    rng = np.random.default_rng(11)
    dtypes = [np.float16, ml_dtypes.bfloat16] if ext == "safetensors" else [np.float16]
    t = {}
    for dt in dtypes:
        name = np.dtype(dt).name
        t[f"{name}.big"] = (rng.standard_normal(2 * STREAM_CHUNK + 4099) * 0.01).astype(dt)
        t[f"{name}.row"] = rng.standard_normal(4096).astype(dt)
        t[f"{name}.short"] = rng.standard_normal(77).astype(dt)
        t[f"{name}.bad"] = rng.standard_normal(STREAM_CHUNK + 3).astype(dt)
        t[f"{name}.bad"][[0, STREAM_CHUNK + 1]] = [np.nan, -np.inf]
        t[f"{name}.subnormal"] = (rng.standard_normal(5000) * 1e-7).astype(dt)
        t[f"{name}.offset"] = (rng.standard_normal(9000) + 300).astype(dt)
    wide = {k: v.astype(np.float32) for k, v in t.items()}
    half_path, wide_path = str(tmp_path / f"half.{ext}"), str(tmp_path / f"wide.{ext}")
    for path, tensors in ((half_path, t), (wide_path, wide)):
        _save(path, tensors, ext)
    calls = []
    real = kernels.compiled_f32_summaries_fd
    with pytest.MonkeyPatch.context() as m:
        if real is not None:
            m.setattr(kernels, "compiled_f32_summaries_fd", lambda *a: calls.append(a) or real(*a))
        half = _summaries(half_path, workers)
    wide_stats = _summaries(wide_path, workers)
    assert [n for n, _ in half.tensors] == [n for n, _ in wide_stats.tensors]
    for (name, a), (_, b) in zip(half.tensors, wide_stats.tensors):
        a, b = a.as_dict(), b.as_dict()
        assert a.pop("dtype") == name.split(".")[0] and b.pop("dtype") == "float32"
        assert repr(a) == repr(b), name
    if real is not None:  # the half-precision tensors went through the kernel's reads
        assert {c[4] for c in calls} == {0, 1} if len(dtypes) == 2 else {c[4] for c in calls} == {0}


def _small_model(rng, with_specials=True):
    """Tensors a batch takes (1 to STREAM_CHUNK float32/float16/bfloat16 elements) among others it does not
    (float64, ints, empty, one chunk more), with NaN/inf, extreme values and a dominating mean mixed in."""
    import ml_dtypes

    sizes = [1, 7, 31, 32, 33, 4095, 4096, 4097, 70_000, STREAM_CHUNK]
    t = {}
    for i in range(60):
        n = sizes[i % len(sizes)]
        dt = [np.float32, np.float16, ml_dtypes.bfloat16][i % 3]
        t[f"layer.{i}.w"] = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 2)).astype(dt)
    t["f64"] = rng.standard_normal(300)
    t["ints"] = np.arange(100, dtype=np.int32)
    t["empty"] = np.zeros(0, np.float32)
    t["two_chunks"] = rng.standard_normal(STREAM_CHUNK + 1).astype(np.float32)
    if with_specials:
        t["layer.3.w"][5] = np.nan
        t["layer.4.w"][2] = -np.inf
        t["layer.6.w"][:] = rng.standard_normal(t["layer.6.w"].size) * 1e25  # squares overflow float32
        t["layer.9.w"][:] = rng.standard_normal(t["layer.9.w"].size) * 1e-3 + 100  # mean dominates
        t["layer.10.w"][:] = 0.0
        t["layer.12.w"][:] = 1e-30  # squares underflow float32
    return t


@pytest.mark.parametrize("ext", ["safetensors", "npz", "numpy.npz", "h5"])
@pytest.mark.parametrize("workers", [1, 2])
def test_small_tensors_summarised_in_batches_equal_one_by_one(tmp_path, ext, workers):
    """Small tensors read and summarised many to a kernel call (tensor_summaries_fd, then one_chunk_stats
    for all of them) give the statistics of streaming them one by one, bit for bit, on one thread and on
    two; the tensors a summary does not decide (NaN, inf, extreme values, all zeros, a dominating mean)
    and the others (float64, ints, empty, more than one chunk) are streamed as before, in file order."""
    if kernels.compiled_tensor_summaries_fd is None:
        pytest.skip("compiled kernel not built")
    t = _small_model(np.random.default_rng(5))
    if ext != "safetensors":  # npz and HDF5 have no bfloat16
        t = {k: v for k, v in t.items() if v.dtype.name != "bfloat16"}
    path = str(tmp_path / f"d.{ext}")
    _save(path, t, ext)
    calls = []
    real = kernels.compiled_tensor_summaries_fd
    with pytest.MonkeyPatch.context() as m:
        m.setattr(kernels, "compiled_tensor_summaries_fd", lambda fd, items, out, *crcs: calls.append(len(items))
                  or real(fd, items, out, *crcs))
        batched = _summaries(path, workers)
        m.setattr(kernels, "compiled_tensor_summaries_fd", None)
        one_by_one = _summaries(path, workers)
    assert [n for n, _ in batched.tensors] == list(t)
    assert [repr(s) for _, s in batched.tensors] == [repr(s) for _, s in one_by_one.tensors]
    small = [k for k, v in t.items() if 0 < v.size <= STREAM_CHUNK and v.dtype.name in ("float32", "float16",
                                                                                         "bfloat16")]
    assert sum(calls) == len(small) and len(calls) < len(small)


def test_a_batch_whose_read_fails_streams_the_rest(tmp_path, monkeypatch):
    """tensor_summaries_fd gives the index where a read failed (a file cut short after it was opened):
    the tensors from there on are streamed one by one, which gives their statistics, or the error with the
    file named."""
    if kernels.compiled_tensor_summaries_fd is None:
        pytest.skip("compiled kernel not built")
    t = _small_model(np.random.default_rng(6), with_specials=False)
    path = str(tmp_path / "d.safetensors")
    save_dump(path, t)
    real = kernels.compiled_tensor_summaries_fd

    def fails_at_5(fd, items, out):
        real(fd, items[:5], out[:5])
        return 5

    monkeypatch.setattr(kernels, "compiled_tensor_summaries_fd", fails_at_5)
    partly = _summaries(path, 1)
    monkeypatch.setattr(kernels, "compiled_tensor_summaries_fd", None)
    assert [repr(s) for _, s in partly.tensors] == [repr(s) for _, s in _summaries(path, 1).tensors]
    monkeypatch.setattr(kernels, "compiled_tensor_summaries_fd", real)
    with open(path, "r+b") as f:  # cut short in the last tensor's bytes
        f.truncate(os.path.getsize(path) - 10)
    with pytest.raises(InputError, match=r"d\.safetensors"):
        _summaries(path, 1)
