"""The compiled one-pass kernel (gradtool/core/_kernels.c) and its NumPy fallback, each against an
independent float64 reference (math.fsum), across SIMD-step (32), block (4096) and tail boundaries, with
NaN, ±inf, ±0 and misaligned buffers; and tensor statistics with the kernel equal those without it."""

import contextlib
import math
import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool import tensor_norm
from gradtool.core import kernels
from gradtool.core.norms import ROW
from gradtool.core.stats import COMPILED_KERNELS, f32_summary, f32_summary_numpy, tensor_stats

EPS32 = float(np.finfo(np.float32).eps)
LANE_RUN = 32  # the kernel sums at most this many elements per float32 lane before going to float64

needs_kernel = pytest.mark.skipif(not COMPILED_KERNELS, reason="compiled kernel not built (no C compiler) or GRADTOOL_NO_KERNELS set")


def test_ci_builds_the_compiled_kernel():
    """CI must exercise the compiled path, not silently fall back to NumPy."""
    if os.environ.get("CI") and not os.environ.get("GRADTOOL_NO_KERNELS"):
        assert COMPILED_KERNELS, "gradtool.core._kernels did not build: is a C compiler installed?"


sizes = st.one_of(st.integers(1, 100), st.sampled_from([31, 32, 33, 4095, 4096, 4097, 8191, 12_345, 1 << 18]))
specials = st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, 3e38, -3e38, 1e-45])


@st.composite
def chunks(draw):
    n = draw(sizes)
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from([1e-30, 1e-3, 1.0, 1e3, 1e30]))
    offset = draw(st.sampled_from([0.0, 0.0, 1.0, -5.0]))  # a non-zero mean tests cancellation in Σx
    rng = np.random.default_rng(seed)
    a = ((rng.standard_normal(n) + offset) * scale).astype(np.float32)
    for _ in range(draw(st.integers(0, 3))):
        a[draw(st.integers(0, n - 1))] = draw(specials)
    if draw(st.booleans()):
        a[rng.random(n) < 0.3] = 0.0
    shift = draw(st.integers(0, 3))  # a view starting 4·shift bytes into a buffer: misaligned loads
    buf = np.empty(n + shift, np.float32)
    buf[shift:] = a
    return buf[shift:]


def _check(summary, a, run):
    """``run``: the most elements summed in float32 before float64 takes over (the error bound's n)."""
    d = a.astype(np.float64)
    if not np.all(np.isfinite(d)):
        assert summary is None
        return
    if summary is None or not (math.isfinite(summary[2]) and math.isfinite(summary[3])):
        assert np.abs(d).max() > 1e18  # allowed only where float32 partial sums (of x or x²) overflow
        return
    lo, hi, s1, s2, zeros = summary
    assert lo == d.min() and hi == d.max()
    assert zeros == int(np.count_nonzero(d == 0))
    n_err = (run + a.size / 1024 + 2) * EPS32
    assert abs(s1 - math.fsum(d.tolist())) <= n_err * math.fsum(np.abs(d).tolist())
    exact_sq = math.fsum((d * d).tolist())
    if np.abs(d).max() > 1e-18:  # float32 squares of smaller values underflow: callers take the exact path
        assert abs(s2 - exact_sq) <= 2 * n_err * exact_sq


@settings(max_examples=300, deadline=None)
@given(chunks())
def test_numpy_summary_against_float64_reference(a):
    _check(f32_summary_numpy(a), a, ROW)  # a float32 dot per row of ROW elements


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(chunks())
def test_compiled_summary_against_float64_reference(a):
    _check(f32_summary(a), a, LANE_RUN)
    # the raw kernel on every size, its NaN and inf sums included
    lo, hi, s1, s2, zeros = kernels.compiled_f32_summary(a)
    d = a.astype(np.float64)
    if np.isnan(d).any():
        assert math.isnan(s1) and math.isnan(s2)
    elif np.isinf(d).any():
        assert not math.isfinite(s2)
    else:
        _check((lo, hi, s1, s2, zeros), a, LANE_RUN)


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(chunks().filter(lambda a: a.size < ROW))
@example(np.float32([1e-45, 3e38, -3e38, 1.0]))  # float32 squares would overflow and underflow
@example(np.where(np.arange(4095) % 64 == 0, np.float32(2**24), np.float32(1)))  # 2^24 + 1 is not a float32
def test_chunks_under_a_row_are_summed_in_float64(a):
    """A chunk shorter than ROW (a bias, a norm scale: most of a small model's tensors) is summed in float64
    by the kernel (float32 products are exact there), as NumPy's passes sum it: within n float64 roundings
    of the exact sums, where the float32 lane sums of longer chunks are allowed ~1e-7. The same for the sum
    of squares f32_scale returns."""
    d = a.astype(np.float64)
    lo, hi, s1, s2, zeros = kernels.compiled_f32_summary(a)
    if not np.all(np.isfinite(d)):
        assert math.isnan(s1) or math.isinf(s1)
        return
    bound = (a.size + 8) * 2.0**-53
    assert (lo, hi, zeros) == (d.min(), d.max(), int(np.count_nonzero(d == 0)))
    assert abs(s1 - math.fsum(d.tolist())) <= bound * math.fsum(np.abs(d).tolist())
    exact_sq = math.fsum((d * d).tolist())
    assert abs(s2 - exact_sq) <= bound * exact_sq
    out = np.empty_like(a)
    assert repr(kernels.compiled_f32_scale(a, 1.0, out)[0]) == repr(s2)


@needs_kernel
def test_compiled_kernel_refuses_other_buffers():
    k = kernels.compiled_f32_summary
    with pytest.raises(TypeError, match="float32"):
        k(np.zeros(8, np.float64))
    with pytest.raises((TypeError, ValueError)):
        k(np.zeros(16, np.float32)[::2])  # not contiguous
    assert k(np.zeros(0, np.float32)) == (math.inf, -math.inf, 0.0, 0.0, 0)


def _widths() -> list[int]:
    from gradtool.core import _kernels

    return _kernels.widths_here()


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(chunks(), st.sampled_from([0.5, 1.0, 0.999, 3e-7, 1.7, 1e30]))
def test_every_vector_width_gives_the_same_bits(a, scale):
    """The loops are built once per native vector width (16 lanes AVX-512, 8 AVX2, 4 SSE2/NEON), each with the
    arithmetic of the same 16 logical lanes: every build this CPU runs gives the same bits, and the one
    used is the widest. (On a machine with one build this checks only that one against itself.)"""
    from gradtool.core import _kernels

    widths = _widths()
    assert widths == sorted(widths, reverse=True) and widths[-1] == 4
    assert repr(_kernels.f32_summary(a)) == repr(_kernels.f32_summary_width(a, widths[0]))
    first = None
    for lanes in widths:
        out = np.empty_like(a)
        got = (repr(_kernels.f32_summary_width(a, lanes)), repr(_kernels.f32_scale_width(a, scale, out, lanes)),
               out.tobytes())
        if first is None:
            first = got
        assert got == first, lanes
    with pytest.raises(ValueError, match="no 7-lane build"):
        _kernels.f32_summary_width(a, 7)


@needs_kernel
def test_the_widest_build_this_cpu_runs_is_used():
    from gradtool.core import _kernels

    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx512f" in flags:
        assert _kernels.SIMD == "avx512f" and _widths()[0] == 16
    elif " avx2" in flags:
        assert _kernels.SIMD == "avx2" and _widths()[0] == 8
    assert _kernels.SIMD in ("avx512f", "avx2", "128-bit")


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(chunks())
def test_tensor_stats_and_norm_with_and_without_kernel(a):
    with_kernel, norm_with = tensor_stats(a), tensor_norm(a)
    with kernels.disabled():
        without, norm_without = tensor_stats(a), tensor_norm(a)
    w, o = with_kernel.as_dict(), without.as_dict()
    amax = float(np.nanmax(np.abs(a.astype(np.float64)))) if a.size and not np.isnan(a).all() else 0.0
    if 1e-18 <= amax <= 1e18:  # the fast domain: stats and tensor_norm share the chunk kernel, the same bits
        assert repr(w["norm"]) == repr(norm_with) and repr(o["norm"]) == repr(norm_without)
    elif math.isfinite(norm_with):  # outside it the two take different exact float64 sums
        assert w["norm"] == pytest.approx(norm_with, rel=1e-12) and o["norm"] == pytest.approx(norm_without, rel=1e-12)
    for key in ("zero_count", "nan_count", "inf_count", "size"):
        assert w[key] == o[key], key
    for key in ("min", "max", "max_abs"):  # equal values; -0.0 and 0.0 may come out of either
        assert (w[key] == o[key]) or (w[key] is None and o[key] is None) or repr(w[key]) == repr(o[key]), key
    for key in ("norm", "l2_norm", "avg_norm", "mean", "std"):
        if o[key] is None or not math.isfinite(o[key]):
            assert repr(w[key]) == repr(o[key])
        elif key in ("mean", "std"):  # Σx in float32 blocks: error relative to max|x|, not to the mean
            assert w[key] == pytest.approx(o[key], rel=1e-5, abs=1e-5 * max(abs(o["min"]), abs(o["max"])))
        else:  # two accurate norms (~1e-9 and ~1e-7): relative agreement
            assert w[key] == pytest.approx(o[key], rel=1e-6)


@needs_kernel
def test_compiled_kernel_takes_explicit_little_endian_views_and_refuses_swapped_bytes(tmp_path):
    from gradtool import open_dump, save_dump

    k = kernels.compiled_f32_summary
    a = np.arange(64, dtype=np.float32)
    save_dump(str(tmp_path / "a.h5"), {"a": a})
    with open_dump(str(tmp_path / "a.h5")) as reader:
        (chunk,) = list(reader.iter_chunks(reader.tensors[0]))
        if memoryview(chunk).format != "f":  # h5py's buffers say "<f" on little-endian machines
            assert k(chunk) == (0.0, 63.0, float(a.sum()), float((a.astype(np.float64) ** 2).sum()), 1)
    with pytest.raises(TypeError):
        k(a.astype(">f4"))  # f32_summary() converts these to native order before calling the kernel
    assert f32_summary(a.astype(">f4").astype(np.float32))[:2] == (0.0, 63.0)


@pytest.mark.parametrize("kind", ["plain", "tiny chunk", "huge chunk", "nan"])
def test_big_tensor_norm_two_threads_equals_chunk_by_chunk(kind):
    """tensor_norm of a big float32 tensor (whole chunks on two threads, one kernel call per half) has the
    same bits as the chunk-by-chunk accumulator and the streamed statistics, and is near math.fsum."""
    from gradtool.core.norms import CHUNK_ELEMENTS, NormAccumulator

    a = np.random.default_rng(11).standard_normal(9 * CHUNK_ELEMENTS + 1234).astype(np.float32)
    if kind == "tiny chunk":
        a[CHUNK_ELEMENTS:2 * CHUNK_ELEMENTS] *= np.float32(1e-30)  # its float32 squares underflow: exact path
    elif kind == "huge chunk":
        a[5 * CHUNK_ELEMENTS + 3] = 1e25  # its float32 square overflows: exact path for that chunk
    elif kind == "nan":
        a[7 * CHUNK_ELEMENTS + 1] = np.nan
    acc = NormAccumulator(2)
    for s in range(0, a.size, CHUNK_ELEMENTS):
        acc.update(a[s:s + CHUNK_ELEMENTS])
    got = tensor_norm(a)
    assert repr(got) == repr(acc.result())
    if kind == "nan":
        assert math.isnan(got)
        return
    d = a.astype(np.float64)
    # The kernel's lanes are fixed (16, no FMA contraction), so its ~1e-9 holds on every CPU; the NumPy
    # fallback's float32 row dots go through OpenBLAS, whose lane count depends on the CPU (1.6e-9 with
    # AVX2, less with AVX-512), so it is held to the accuracy contract: 1e-7 of math.fsum.
    rel = 1e-9 if COMPILED_KERNELS else 1e-7
    assert got == pytest.approx(math.sqrt(math.fsum((d * d).tolist())), rel=rel)
    if kind != "huge chunk":  # beyond 1e18 the statistics take their own exact path (see above)
        assert repr(tensor_stats(a).norm) == repr(got)


def test_many_big_tensors_on_two_threads_keep_each_norms_bits():
    """global_norm deals big float32 tensors to two threads; every tensor's norm keeps tensor_norm's bits,
    and non-float32 / non-contiguous ones take the ordinary path, in the caller's order."""
    from gradtool import global_norm
    from gradtool.core.norms import CHUNK_ELEMENTS, _l2_norms, combine_norms

    rng = np.random.default_rng(5)
    tensors = [rng.standard_normal(n).astype(np.float32) for n in (9 * CHUNK_ELEMENTS + 5, 3 * CHUNK_ELEMENTS,
                                                                  CHUNK_ELEMENTS // 2, 7 * CHUNK_ELEMENTS + 1)]
    tensors.append(rng.standard_normal((2000, 3000)).astype(np.float32).T)  # not C-contiguous
    tensors.append(rng.standard_normal(2 * CHUNK_ELEMENTS))  # float64
    tensors[3][17] = np.inf
    got = _l2_norms(tensors)
    assert [repr(v) for v in got] == [repr(tensor_norm(t)) for t in tensors]
    del tensors[3]
    total = global_norm(tensors)
    assert repr(total) == repr(combine_norms([tensor_norm(t) for t in tensors]))
    exact = math.sqrt(math.fsum(math.fsum((t.astype(np.float64).ravel() ** 2).tolist()) for t in tensors))
    assert total == pytest.approx(exact, rel=1e-9)


@needs_kernel
def test_summaries_read_from_a_file_equal_those_of_the_array(tmp_path):
    """f32_summaries_fd (pread into a cache-resident buffer, in C) gives f32_summaries' tuples, at any byte
    offset; a file that ends early is an EOFError, a bad descriptor an OSError."""
    if kernels.compiled_f32_summaries_fd is None:
        pytest.skip("no pread on this platform")
    a = np.random.default_rng(3).standard_normal(3 * 4096 + 77).astype(np.float32)
    a[5000] = np.nan
    path = tmp_path / "raw.bin"
    path.write_bytes(b"abc" + a.tobytes())  # offset 3: unaligned for float32
    fd = os.open(path, os.O_RDONLY)
    try:
        got = kernels.compiled_f32_summaries_fd(fd, 3, a.size, 4096)
        want = kernels.compiled_f32_summaries(a, 4096)
        assert repr(got) == repr(want) and len(got) == 4
        assert kernels.compiled_f32_summaries_fd(fd, 3, 0, 4096) == []
        with pytest.raises(EOFError):
            kernels.compiled_f32_summaries_fd(fd, 3, a.size + 1, 4096)
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        kernels.compiled_f32_summaries_fd(fd, 0, 10, 4096)  # closed descriptor


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(phase=st.integers(0, 2 * 4096 - 1), chunks=st.integers(1, 5), rest=st.integers(0, 999),
       chunk=st.sampled_from([1000, 1024, 1500, 4096]))
@example(phase=4092, chunks=3, rest=1, chunk=1000)  # the last phase of a page, moving by 4000 bytes a chunk
@example(phase=0, chunks=2, rest=0, chunk=1024)  # page-aligned: the buffer is placed at the page's start
@example(phase=4063, chunks=1, rest=999, chunk=4096)  # the highest 64-byte phase, and unaligned for float32
def test_summaries_read_from_a_file_at_every_page_phase(tmp_path_factory, phase, chunks, rest, chunk):
    """f32_summaries_fd places its read buffer at each chunk's own phase in a page (so that the kernel's
    copy is never 1-31 bytes behind): the same tuples as the in-memory kernel whatever that phase is,
    every chunk inside the buffer (chunks of sizes that are not page multiples move the phase)."""
    if kernels.compiled_f32_summaries_fd is None:
        pytest.skip("no pread on this platform")
    a = np.random.default_rng(phase).standard_normal(chunks * chunk + rest).astype(np.float32)
    path = tmp_path_factory.mktemp("phase") / "raw.bin"
    path.write_bytes(b"\xff" * phase + a.tobytes() + b"\xff" * 64)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = kernels.compiled_f32_summaries_fd(fd, phase, a.size, chunk)
    finally:
        os.close(fd)
    assert repr(got) == repr(kernels.compiled_f32_summaries(a, chunk))


needs_crc = pytest.mark.skipif(kernels.compiled_crc32_combine is None or kernels.compiled_f32_summaries_fd is None,
                               reason="compiled kernel not built, or no pread on this platform")


@needs_crc
@settings(max_examples=80, deadline=None)
@given(lead=st.integers(0, 200), count=st.integers(0, 3 * 1024 + 5), chunk=st.sampled_from([1, 7, 64, 1000, 1024]),
       kind=st.sampled_from([-1, 0, 1]), seed=st.integers(0, 2**32 - 1), data=st.randoms(use_true_random=False))
@example(lead=0, count=16, chunk=1024, kind=-1, seed=0, data=__import__("random").Random(0))  # 64 bytes: one fold
def test_summaries_read_from_a_file_take_zlibs_crc_of_the_bytes_on_the_way(tmp_path_factory, lead, count, chunk,
                                                                          kind, seed, data):
    """f32_summaries_fd(..., crc=seed) gives the same summaries as without it, and zlib.crc32 of exactly
    the bytes it read, continued from the seed (an npz member's check in the pass that reads it), at any
    offset, length and chunking, float32 or half precision; no bytes read, the seed itself."""
    import zlib

    item = 4 if kind == -1 else 2
    body = data.randbytes(count * item)
    path = tmp_path_factory.mktemp("crc") / "raw.bin"
    path.write_bytes(data.randbytes(lead) + body + data.randbytes(50))
    fd = os.open(path, os.O_RDONLY)
    try:
        plain = kernels.compiled_f32_summaries_fd(fd, lead, count, chunk, kind)
        summaries, crc = kernels.compiled_f32_summaries_fd(fd, lead, count, chunk, kind, seed)
    finally:
        os.close(fd)
    assert repr(summaries) == repr(plain)
    assert crc == zlib.crc32(body, seed)


@needs_crc
def test_a_crc_seed_out_of_range_is_refused(tmp_path):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(64))
    fd = os.open(path, os.O_RDONLY)
    try:
        for bad in (2**32, -1):
            with pytest.raises((ValueError, OverflowError)):
                kernels.compiled_f32_summaries_fd(fd, 0, 16, 16, -1, bad)
        with pytest.raises(TypeError):
            kernels.compiled_f32_summaries_fd(fd, 0, 16, 16, -1, "0")
    finally:
        os.close(fd)


@needs_crc
@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 700), st.sampled_from([-1, 0, 1]),
                               st.integers(0, 2**32 - 1)), min_size=1, max_size=12),
       data=st.randoms(use_true_random=False))
def test_many_small_tensors_take_each_ones_crc_from_its_seed(tmp_path_factory, rows, data):
    """tensor_summaries_fd(fd, items, out, crcs): crcs[i] becomes zlib.crc32(item i's bytes, crcs[i]), the
    summaries as without crcs (items may overlap: each is read on its own)."""
    import zlib

    raw = data.randbytes(300 + 700 * 4 + 16)
    path = tmp_path_factory.mktemp("crcs") / "raw.bin"
    path.write_bytes(raw)
    items = np.array([(off, count, kind) for off, count, kind, _ in rows], np.int64)
    crcs = np.array([seed for *_, seed in rows], np.uint32)
    out, plain = np.empty((len(rows), 5)), np.empty((len(rows), 5))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert kernels.compiled_tensor_summaries_fd(fd, items, plain) == -1
        assert kernels.compiled_tensor_summaries_fd(fd, items, out, crcs) == -1
    finally:
        os.close(fd)
    np.testing.assert_array_equal(out, plain)
    want = [zlib.crc32(raw[off: off + count * (4 if kind == -1 else 2)], seed) for off, count, kind, seed in rows]
    assert crcs.tolist() == want


@needs_crc
def test_many_small_tensors_refuse_crcs_of_another_type_or_length(tmp_path):
    path = tmp_path / "raw.bin"
    path.write_bytes(bytes(64))
    items, out = np.array([(0, 4, -1), (16, 4, -1)], np.int64), np.empty((2, 5))
    fd = os.open(path, os.O_RDONLY)
    try:
        for crcs in (np.zeros(2, np.int64), np.zeros(2, np.int32), np.zeros(3, np.uint32), np.zeros(1, np.uint32)):
            with pytest.raises(ValueError, match="crcs"):
                kernels.compiled_tensor_summaries_fd(fd, items, out, crcs)
        with pytest.raises(BufferError):  # (read-only: the CRCs are written into it)
            kernels.compiled_tensor_summaries_fd(fd, items, out, np.zeros(2, np.uint32).data.toreadonly())
    finally:
        os.close(fd)


@needs_crc
@settings(max_examples=200, deadline=None)
@given(a=st.binary(max_size=3000), b=st.binary(max_size=3000), seed=st.integers(0, 2**32 - 1),
       zeros=st.sampled_from([0, 1, 4095, 1 << 20, (1 << 24) + 7]))
def test_compiled_crc32_combine_is_the_crc_of_the_joined_bytes(a, b, seed, zeros):
    """The kernel's crc32_combine (zlib's): from the CRCs of two pieces and the second's length, the CRC
    of both, for lengths up to megabytes; the Python one (gradtool.io.inflate) agrees."""
    import zlib

    from gradtool.io.inflate import crc32_combine

    b += bytes(zeros)
    got = kernels.compiled_crc32_combine(zlib.crc32(a, seed), zlib.crc32(b), len(b))
    assert got == zlib.crc32(a + b, seed) == crc32_combine(zlib.crc32(a, seed), zlib.crc32(b), len(b))


def test_big_norms_from_the_pools_own_threads_do_not_deadlock():
    from gradtool.core.norms import CHUNK_ELEMENTS, _pool

    a = np.ones(9 * CHUNK_ELEMENTS, np.float32)
    futures = [_pool().submit(tensor_norm, a) for _ in range(4)]  # each would want both pool threads
    assert [f.result(timeout=60) for f in futures] == [math.sqrt(a.size)] * 4


@pytest.mark.parametrize("kind", ["plain", "nan", "inf", "huge", "tiny"])
@pytest.mark.parametrize("kernel", [True, False])
def test_global_norm_of_many_small_tensors(kind, kernel):
    """Many small float32 tensors (the compiled kernel on two threads, or np.vdot per tensor): near the
    math.fsum reference, NaN/inf as the exact path says, and squares that overflow or underflow float32
    sent to the exact path."""
    from gradtool import global_norm

    if kernel and not kernels.BUILT:
        pytest.skip("compiled kernel not built")
    rng = np.random.default_rng(8)
    ts = [rng.standard_normal(int(rng.integers(1, 5000)), dtype=np.float32) for _ in range(300)]
    if kind == "nan":
        ts[123][0] = np.nan
    elif kind == "inf":
        ts[7][-1] = -np.inf
    elif kind == "huge":
        ts[50] *= np.float32(1e25)  # float32 squares overflow
    elif kind == "tiny":
        ts = [t * np.float32(1e-30) for t in ts]  # float32 squares underflow
    with contextlib.nullcontext() if kernel else kernels.disabled():
        got = global_norm(ts)
    d = [t.astype(np.float64) for t in ts]
    if kind == "nan":
        assert math.isnan(got)
    elif kind == "inf":
        assert got == math.inf
    else:
        big = max(float(np.abs(x).max()) for x in d)
        exact = big * math.sqrt(math.fsum(math.fsum(((x / big) ** 2).tolist()) for x in d))
        assert got == pytest.approx(exact, rel=1e-7)


@needs_kernel
def test_sumsq_each_checks_every_buffer():
    k = kernels.compiled_f32_sumsq_each
    assert k([]) == []
    a = np.arange(5000, dtype=np.float32)
    got = k([a, a[:3]])
    assert got[0] == pytest.approx(float((a.astype(np.float64) ** 2).sum()), rel=1e-7) and got[1] == 5.0
    with pytest.raises(TypeError):
        k([a, np.zeros(3)])  # float64
    with pytest.raises((TypeError, ValueError)):
        k([a[::2]])  # not contiguous
    with pytest.raises(TypeError):
        k(5)


@needs_kernel
@settings(max_examples=150, deadline=None)
@given(chunks(), st.sampled_from([0.5, 0.3, 1e-4, 2.0, 1e30, 0.0, -0.7, np.nan, np.inf, 1 - 2**-24, 1e-39]))
def test_fused_scale_equals_multiply_count_and_summary(a, scale):
    """f32_scale: out = a · float32(scale) bit for bit (NumPy's float32 multiply, clipping.scale_tensor's
    arithmetic), Σout² with the bits of f32_summary(out), and the number of changed elements counted
    directly (NaN -> NaN unchanged, -0.0 == 0.0)."""
    out = np.empty_like(a)
    sum_sq, changed = kernels.compiled_f32_scale(a, scale, out)
    with np.errstate(all="ignore"):
        expected = a * np.float32(scale)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))
    reference = kernels.compiled_f32_summary(out)[3]
    assert sum_sq == reference or (math.isnan(sum_sq) and math.isnan(reference))
    differs = (expected != a) & ~(np.isnan(expected) & np.isnan(a))
    assert changed == int(np.count_nonzero(differs))


@needs_kernel
def test_fused_scale_in_place_and_refusals():
    a = np.arange(100, dtype=np.float32)
    sum_sq, changed = kernels.compiled_f32_scale(a, 0.5, a)  # out may be the input
    assert a[:3].tolist() == [0.0, 0.5, 1.0] and changed == 99
    assert sum_sq == math.fsum((0.5 * i) ** 2 for i in range(100))
    with pytest.raises(TypeError):
        kernels.compiled_f32_scale(a, 0.5, np.empty(99, np.float32))  # lengths differ
    with pytest.raises(TypeError):
        kernels.compiled_f32_scale(a, 0.5, np.empty(100, np.float64))
    with pytest.raises(TypeError):
        kernels.compiled_f32_scale(a.astype(np.float64), 0.5, np.empty(100, np.float32))
    frozen = np.empty(100, np.float32)
    frozen.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        kernels.compiled_f32_scale(a, 0.5, frozen)


# ------------------------------------------------------------------------------ float16 and bfloat16
HALF_KINDS = [(kernels.HALF_F16, np.dtype(np.float16)), (kernels.HALF_BF16, np.dtype(ml_dtypes.bfloat16))]


@needs_kernel
@pytest.mark.parametrize("kind,dtype", HALF_KINDS, ids=["float16", "bfloat16"])
def test_every_half_precision_value_widens_exactly_at_every_width(kind, dtype):
    """All 65,536 bit patterns of float16 and of bfloat16, widened by every vector build (and the scalar
    tail: 65,536 + 7 values), are NumPy's/ml_dtypes' float32 values bit for bit; a NaN stays a NaN (the
    hardware conversion may quiet a signalling one)."""
    from gradtool.core import _kernels

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = np.concatenate([every, np.uint16([1, 0x8001, 0x3c00, 0x7c00, 0xfc00, 1, 2])])
    want = bits.view(dtype).astype(np.float32)
    nan = np.isnan(want)
    for lanes in _widths():
        got = np.empty(bits.size, np.float32)
        _kernels.half_to_f32_width(bits, got, kind, lanes)
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), lanes
        assert np.isnan(got[nan]).all(), lanes


@st.composite
def half_chunks(draw):
    """float16/bfloat16 values (as a uint16 view, maybe 2 bytes into its buffer) with zeros, subnormals, the
    largest values, NaN and ±inf mixed in, and a chunk length."""
    kind, dtype = draw(st.sampled_from(HALF_KINDS))
    n = draw(sizes)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-6, 1e-2, 1.0, 100.0]))
    a = ((rng.standard_normal(n) + draw(st.sampled_from([0.0, 3.0]))) * scale).astype(dtype)
    info = ml_dtypes.finfo(dtype)
    specials_half = [0.0, -0.0, np.nan, np.inf, -np.inf, float(info.max), -float(info.max),
                     float(info.smallest_subnormal)]
    for _ in range(draw(st.integers(0, 3))):
        a[draw(st.integers(0, n - 1))] = draw(st.sampled_from(specials_half))
    shift = draw(st.integers(0, 1))
    buf = np.empty(n + shift, dtype)
    buf[shift:] = a
    return kind, buf[shift:], draw(st.sampled_from([32, 4096, 5000, 1 << 18]))


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(half_chunks())
def test_half_summaries_are_the_float32_summaries_of_the_widened_values(case):
    """half_summaries (values widened as they are loaded, or in a stack buffer under 4,096 elements) gives
    f32_summaries of ``a.astype(float32)`` bit for bit, chunk by chunk, from every vector build; so the
    statistics of a float16/bfloat16 tensor are those of its float32 values, as before the kernel took it."""
    from gradtool.core import _kernels

    kind, a, chunk = case
    want = repr(kernels.compiled_f32_summaries(a.astype(np.float32), chunk))
    assert repr(kernels.compiled_half_summaries(a.view(np.uint16), chunk, kind)) == want
    for lanes in _widths():
        assert repr(_kernels.half_summaries_width(a.view(np.uint16), chunk, kind, lanes)) == want, lanes


@needs_kernel
def test_half_summaries_read_from_a_file_and_refusals(tmp_path):
    """f32_summaries_fd with a half-precision kind reads 2-byte values at any byte offset and gives
    half_summaries' tuples; a file that ends early is an EOFError; a kind other than 0 or 1, or a buffer
    whose items are not 2 bytes, is refused."""
    if kernels.compiled_f32_summaries_fd is None:
        pytest.skip("no pread on this platform")
    for kind, dtype in HALF_KINDS:
        a = np.random.default_rng(kind).standard_normal(3 * 4096 + 77).astype(dtype)
        a[5000] = np.nan
        path = tmp_path / f"raw{kind}.bin"
        path.write_bytes(b"abc" + a.tobytes())  # offset 3: unaligned for 2-byte values
        fd = os.open(path, os.O_RDONLY)
        try:
            got = kernels.compiled_f32_summaries_fd(fd, 3, a.size, 4096, kind)
            assert repr(got) == repr(kernels.compiled_half_summaries(a.view(np.uint16), 4096, kind))
            assert len(got) == 4 and math.isnan(got[1][2])
            with pytest.raises(EOFError):
                kernels.compiled_f32_summaries_fd(fd, 3, a.size + 1, 4096, kind)
            with pytest.raises(ValueError, match="kind"):
                kernels.compiled_f32_summaries_fd(fd, 3, a.size, 4096, 2)
        finally:
            os.close(fd)
    with pytest.raises(TypeError, match="2-byte"):
        kernels.compiled_half_summaries(np.zeros(8, np.float32), 4, kernels.HALF_F16)
    with pytest.raises(ValueError, match="kind"):
        kernels.compiled_half_summaries(np.zeros(8, np.uint16), 4, 5)


@settings(max_examples=60, deadline=None)
@given(half_chunks())
def test_half_precision_tensor_stats_are_those_of_its_float32_values(case):
    """tensor_stats of a float16/bfloat16 array (the kernel's half path where built, NumPy's widening
    otherwise) equals tensor_stats of the same values as float32 in every field but the dtype."""
    kind, a, _ = case
    half, wide = tensor_stats(a).as_dict(), tensor_stats(a.astype(np.float32)).as_dict()
    assert half.pop("dtype") in ("float16", "bfloat16") and wide.pop("dtype") == "float32"
    assert repr(half) == repr(wide)


@settings(max_examples=200, deadline=None)
@given(chunks(), st.sampled_from([2, "inf"]), st.booleans())
def test_one_chunk_stats_are_the_accumulators_for_one_chunk(a, norm_type, kernel):
    """one_chunk_stats (the statistics of many small tensors from their kernel summaries, computed for all
    at once) gives tensor_stats' result bit for bit wherever it gives one (summaries from the compiled kernel
    or from NumPy's passes alike), and leaves to the accumulator (None) exactly the chunks that need their
    data: NaN/inf, max |x| beyond [1e-18, 1e18], a dominating mean (which includes all zeros)."""
    from gradtool.core.stats import one_chunk_stats

    if kernel and not COMPILED_KERNELS:
        kernel = False
    with contextlib.nullcontext() if kernel else kernels.disabled():
        summary = f32_summary(np.ascontiguousarray(a))
        rows = np.array([summary if summary is not None else (np.nan,) * 5], np.float64)
        got = one_chunk_stats(rows, [a.size], [(a.size,)], ["float32"], norm_type)[0]
        want = tensor_stats(a, norm_type)
    d = a.astype(np.float64)
    if summary is None or not np.isfinite(d).all():
        assert got is None
        return
    amax = float(np.abs(d).max())
    mean = summary[2] / a.size
    needs_data = amax > 1e18 or 0 < amax < 1e-18 or not summary[3] - a.size * mean * mean > 1e-3 * summary[3]
    assert (got is None) == needs_data
    if got is not None:
        assert repr(got) == repr(want)


def test_one_chunk_stats_of_many_rows_and_the_l1_norm():
    """Rows are independent (a row that needs its data does not disturb the others), and the L1 norm, which
    needs the data, gives None for every row."""
    from gradtool.core.stats import one_chunk_stats

    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (3, 5, 4096, 70_000)]
    arrays[1][2] = np.nan
    rows = np.array([s if (s := f32_summary(x)) is not None else (np.nan,) * 5 for x in arrays], np.float64)
    shapes = [(x.size,) for x in arrays]
    got = one_chunk_stats(rows, [x.size for x in arrays], shapes, ["float32"] * 4)
    assert got[1] is None
    assert [repr(s) for i, s in enumerate(got) if i != 1] == [repr(tensor_stats(x)) for i, x in enumerate(arrays)
                                                                  if i != 1]
    assert one_chunk_stats(rows, [x.size for x in arrays], shapes, ["float32"] * 4, 1) == [None] * 4


@needs_kernel
@pytest.mark.parametrize("kind,dtype", HALF_KINDS, ids=["float16", "bfloat16"])
def test_rounding_to_half_precision_is_numpys_at_every_width(kind, dtype):
    """float32 values rounded to float16/bfloat16 by every vector build (and the scalar rest) are NumPy's and
    ml_dtypes' astype, bit for bit: random bit patterns, the whole subnormal and overflow boundaries, NaNs.
    A signalling NaN may come out quieted from the hardware conversion (still NaN); clip only rounds
    products, which are quiet already."""
    from gradtool.core import _kernels

    rng = np.random.default_rng(kind)
    bits = np.concatenate([rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32),
                           np.arange(0x33000000 - 999, 0x38800000 + 999, 97, dtype=np.uint32),
                           np.arange(0x477fe000, 0x47801000, dtype=np.uint32),
                           np.uint32([0x7f800001, 0x7fc00000])])
    bits = np.concatenate([bits, bits | np.uint32(0x80000000), bits[:5]])  # both signs; a scalar rest
    x = bits.view(np.float32)
    with np.errstate(all="ignore"):
        want = x.astype(dtype).view(np.uint16)
    signalling = np.isnan(x) & (bits & 0x400000 == 0)
    for lanes in _widths():
        got = np.empty(x.size, np.uint16)
        _kernels.f32_to_half_width(x, got, kind, lanes)
        assert np.array_equal(got[~signalling], want[~signalling]), lanes
        assert np.isnan(got[signalling].view(dtype)).all(), lanes


@needs_kernel
@pytest.mark.parametrize("kind, dtype", HALF_KINDS)
@pytest.mark.parametrize("scale", [0.5, 1.0, 1e-3, 2e-6, 3e-7, 1e-39, 0.0, -0.7, -1.0, np.nan, np.inf, 1e30])
def test_half_scale_and_its_slices_count_every_half_value_s_change(kind, dtype, scale):
    """Every one of the 65,536 float16 or bfloat16 values scaled (in place, to another buffer, and as
    slices): the changed count, which the kernel takes from the bits (NaN to NaN not counted, +0 and -0
    equal), is the count clip takes with NumPy's float comparisons, and the values are scale_tensor's
    (a NaN scale makes NaN of every value; of an input NaN with a payload, the CPU keeps that payload
    where NumPy gives its own: the same before this test)."""
    from gradtool.core.clipping import scale_tensor

    def same(got, want):  # bit for bit; but where want is NaN, any NaN when the scale is NaN
        g, w = got.view(np.uint16), want.view(np.uint16)
        nan = np.isnan(want.astype(np.float32)) & math.isnan(scale)
        return np.array_equal(g[~nan], w[~nan]) and bool(np.isnan(got.astype(np.float32))[nan].all())

    a = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    with np.errstate(all="ignore"):
        want = scale_tensor(a, scale, np)
        changed = int(np.count_nonzero((a != want) & ~(np.isnan(a) & np.isnan(want))))
    for in_place in (False, True):
        src = a.copy()
        out = src if in_place else np.empty_like(a)
        _, n_changed = kernels.compiled_half_scale(src.view(np.uint16), scale, out.view(np.uint16), kind)
        assert same(out, want) and n_changed == changed
    rows = a.reshape(256, 256)
    for by_row in (True, False) if not scale < 0 else ():  # (a negative scale marks a kept slice)
        out = np.empty_like(rows)
        scales = np.full(256, scale, np.float32)
        scales[::3] = -1.0  # (kept slices: unchanged, not counted)
        kept = np.zeros(256, bool)
        kept[::3] = True
        with np.errstate(all="ignore"):
            w = np.where(kept[:, None] if by_row else kept[None, :], rows, scale_tensor(rows, scale, np))
            changed = int(np.count_nonzero((rows != w) & ~(np.isnan(rows) & np.isnan(w))))
        got = kernels.compiled_half_scale_slices(rows.view(np.uint16), scales, out.view(np.uint16), kind, by_row)
        assert same(out, w) and got == changed


@needs_kernel
@pytest.mark.parametrize("kind, dtype", HALF_KINDS)
@pytest.mark.parametrize("scale", [0.5, 1e-3, 3e-7, 1e-39, 0.0, -0.7, np.inf, 1e30])
def test_half_scale_of_every_half_value_is_the_same_at_every_width(kind, dtype, scale):
    """half_scale's loop in registers (widen, multiply, round, count: half_scale_loop, once per vector
    width; the portable build's float16 a step a pass) gives every build's bits, count and sum of squares,
    for every one of the 65,536 values (NaN payloads, both zeros, subnormals, ±inf), in place and not, at
    lengths that leave tails; scale_tensor's values (the non-NaN scales: of a NaN input, the CPU's payload)."""
    from gradtool.core import _kernels
    from gradtool.core.clipping import scale_tensor

    a = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    with np.errstate(all="ignore"):
        want = scale_tensor(a, scale, np).view(np.uint16)
    nan = np.isnan(a.astype(np.float32))
    results = []
    for lanes in _widths():
        for cut in (1 << 16, 65_535 - 40, 7):
            for in_place in (False, True):
                src = a[:cut].copy()
                out = src if in_place else np.empty_like(src)
                got = _kernels.half_scale_width(src.view(np.uint16), scale, out.view(np.uint16), kind, lanes)
                results.append((cut, in_place, out.view(np.uint16).tobytes(), got))
                assert np.array_equal(out.view(np.uint16)[~nan[:cut]], want[:cut][~nan[:cut]]), lanes
    first = {(cut, in_place): (b, g) for cut, in_place, b, g in results[:6]}
    for cut, in_place, b, g in results:
        assert (b, repr(g)) == (first[cut, in_place][0], repr(first[cut, in_place][1]))


@needs_kernel
@settings(max_examples=150, deadline=None)
@given(half_chunks(), st.sampled_from([0.5, 0.3, 1e-4, 3e-7, 2.0, 1e30, 0.0, -0.7, np.nan, np.inf, 1e-39]),
       st.booleans())
def test_half_scale_equals_scale_tensor_count_and_summary(case, scale, in_place):
    """half_scale gives clipping.scale_tensor's values (multiplied in float32, rounded once) bit for bit, the
    changed count clip takes with NumPy (NaN to NaN unchanged), and the output's float32 sum of squares as
    one chunk (half_summaries' bits, what the norm after is made of); in place too."""
    from gradtool.core.clipping import scale_tensor

    kind, a, _ = case
    with np.errstate(all="ignore"):
        want = scale_tensor(a, scale, np)
        changed = int(np.count_nonzero((a != want) & ~(np.isnan(a) & np.isnan(want))))
    src = a.copy()
    out = src if in_place else np.empty_like(a)
    sumsq, n_changed = kernels.compiled_half_scale(src.view(np.uint16), scale, out.view(np.uint16), kind)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    assert n_changed == changed
    whole = kernels.compiled_half_summaries(out.view(np.uint16), max(a.size, 1), kind)
    assert repr(sumsq) == repr(whole[0][3])
    with pytest.raises(ValueError, match="size"):
        kernels.compiled_half_scale(src.view(np.uint16), 0.5, np.empty(a.size + 1, np.uint16), kind)


def _clipped_slices(x, rng, by_row, extreme):
    """(x's rows, or columns, clipped as the NumPy path clips them: about 70 % by a random scale, one by
    ``extreme``; the kernels' float32 scales, negative for a slice kept)."""
    from gradtool.core.clipping import scale_slices

    k = x.shape[0] if by_row else x.shape[1]
    clipped = rng.random(k) < 0.7
    scale = rng.uniform(1e-3, 1.0, k)
    scale[int(rng.integers(0, k))] = extreme
    with np.errstate(all="ignore"):
        want = scale_slices(x, clipped, scale, np) if by_row else scale_slices(x.T, clipped, scale, np).T
    return want, np.where(clipped, scale, -1.0).astype(np.float32)


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(half_chunks(), st.integers(1, 5000), st.integers(0, 2**32 - 1), st.booleans(),
       st.sampled_from([0.5, 0.3, 1e-4, 3e-7, 2.0, 1e30, 0.0, -0.0, np.nan, np.inf, 1e-39]))
def test_half_scale_slices_equals_scale_tensor_where_clipped(case, width, seed, by_row, extreme):
    """half_scale_slices gives what the NumPy path of per-slice clipping gives, bit for bit: the clipped
    columns (or rows) by ``clipping.scale_tensor`` (multiplied in float32, rounded once; a NaN scale, a
    NaN norm's, makes NaN), the others kept as they are (NaN payloads too), and ``_changed``'s count (NaN
    to NaN unchanged); rows of any width, across the kernel's blocks of 2,048 elements. (A negative
    scale marks a kept slice: a clipping scale c / norm, c > 0, never is one; -0.0 is not negative.)"""

    kind, a, _ = case
    n = max(1, a.size // width)
    x = np.resize(a, n * width).reshape(n, width)  # (repeats a's values: rows of width elements)
    want, scales = _clipped_slices(x, np.random.default_rng(seed), by_row, extreme)
    with np.errstate(all="ignore"):
        changed = int(np.count_nonzero((x != want) & ~(np.isnan(x) & np.isnan(want))))
    out = np.empty_like(x)
    got = kernels.compiled_half_scale_slices(x.view(np.uint16), scales, out.view(np.uint16), kind, by_row)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    assert got == changed
    flat, flat_out = x.view(np.uint16).reshape(-1), out.view(np.uint16).reshape(-1)
    with pytest.raises(ValueError, match="whole slices"):  # the input as its output
        kernels.compiled_half_scale_slices(flat, scales, flat, kind, by_row)
    if scales.size > 1:
        with pytest.raises(ValueError, match="whole slices"):  # a slice cut short (one element more)
            kernels.compiled_half_scale_slices(np.append(flat, flat[:1]), scales,
                                               np.append(flat_out, flat_out[:1]), kind, by_row)


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20000), st.integers(1, 5000), st.integers(0, 2**32 - 1), st.booleans(),
       st.sampled_from([0.5, 0.3, 1e-4, 3e-7, 2.0, 1e30, 0.0, -0.0, np.nan, np.inf]))
def test_f32_scale_slices_equals_scale_tensor_where_clipped(size, width, seed, by_row, extreme):
    """f32_scale_slices gives what the NumPy path of per-slice clipping gives for float32, bit for bit: the
    clipped columns (or rows) by ``clipping.scale_tensor`` (the scale rounded to float32, a float32
    product; a NaN scale makes NaN), the others kept (NaN payloads too), and ``_changed``'s count (NaN to
    NaN unchanged, -0 equal to +0); values with zeros, subnormals, the largest, NaN (two payloads) and
    ±inf; rows of any width, across the kernel's blocks of 2,048 elements."""
    from gradtool.clip_dump import _changed

    rng = np.random.default_rng(seed)
    n = max(1, size // width)
    x = (rng.standard_normal(n * width) * rng.choice([1e-3, 1.0, 1e30], n * width)).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, 1e-45, np.nan], np.float32)
    at = rng.integers(0, x.size, 6)
    x[at] = rng.choice(specials, 6)
    x.view(np.uint32)[at[0]] = 0x7FC00123  # a NaN of another payload
    x = x.reshape(n, width)
    want, scales = _clipped_slices(x, rng, by_row, extreme)
    out = np.empty_like(x)
    got = kernels.compiled_f32_scale_slices(x.reshape(-1), scales, out.reshape(-1), by_row)
    nan = np.isnan(want)  # (NaN payloads aside: which NaN a product of two keeps is the compiler's choice,
    assert np.array_equal(np.isnan(out), nan)  # and NumPy's differs between its loops)
    assert out[~nan].tobytes() == want[~nan].tobytes()
    sc = np.broadcast_to(scales[:, None] if by_row else scales[None, :], x.shape)
    one_nan = np.isnan(x) & ~np.isnan(sc)  # (a NaN element of a finite scale, or kept: its own NaN)
    assert out[one_nan].tobytes() == x[one_nan].tobytes()
    assert got == _changed(x, want, np)
    flat = x.reshape(-1)
    with pytest.raises(ValueError, match="whole slices"):  # the input as its output
        kernels.compiled_f32_scale_slices(flat, scales, flat, by_row)
    if scales.size > 1:
        with pytest.raises(ValueError, match="whole slices"):
            kernels.compiled_f32_scale_slices(np.append(flat, flat[:1]), scales, np.append(flat, flat[:1]), by_row)


def _same_bits_but_nan(a, b):
    """float64 arrays equal bit for bit, every NaN taken as one."""
    a, b = np.where(np.isnan(a), np.nan, a), np.where(np.isnan(b), np.nan, b)
    return a.tobytes() == b.tobytes()


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(half_chunks(), st.integers(2, 5000), st.booleans(), st.integers(1, 7))
def test_column_sumsq_is_numpys_sum_of_squares_over_the_rows(case, width, as_float32, pieces):
    """column_sumsq adds each column's squares (float16, bfloat16 or float32 widened to float64 and
    squared there) row after row into its accumulator: the bits of NumPy's ``np.add.reduce(sq, axis=0)``
    (rows in order; NaN as NaN, ±inf, subnormals, the largest values), whether the rows come in one call
    or in several (the accumulator carried, as clip streams them), rows wider than the kernel's blocks of
    2,048 elements too (of two elements or more: NumPy sums a column of one pairwise, and clip never
    takes those by columns); it refuses an accumulator that is not a row long or a piece of part of a row."""
    kind, a, _ = case
    n = max(1, a.size // width)
    x = np.resize(a, n * width).reshape(n, width)
    if as_float32:
        kind, x = -1, x.astype(np.float32)
    with np.errstate(all="ignore"):
        sq = x.astype(np.float64)
        sq *= sq
        want = np.add.reduce(sq, axis=0)
    got = np.zeros(width)
    cuts = sorted({0, n, *np.random.default_rng(n + width).integers(0, n + 1, pieces - 1).tolist()})
    for lo, hi in zip(cuts, cuts[1:]):
        part = np.ascontiguousarray(x[lo:hi]).reshape(-1)
        kernels.compiled_column_sumsq(part if kind == -1 else part.view(np.uint16), got, kind)
    assert _same_bits_but_nan(got, want)
    flat = x.reshape(-1) if kind == -1 else x.reshape(-1).view(np.uint16)
    if width > 1:  # (a row cut short)
        with pytest.raises(ValueError, match="whole rows"):
            kernels.compiled_column_sumsq(flat[:-1], np.zeros(width), kind)
    with pytest.raises(ValueError, match="whole rows"):
        kernels.compiled_column_sumsq(flat, np.zeros(0), kind)
    with pytest.raises((ValueError, TypeError)):
        kernels.compiled_column_sumsq(flat, np.zeros(width, np.float32), kind)


_BOUNDS = [(-1e-3, 1e-3), (-1.0, 1.0), (0.0, 0.0), (-0.0, 0.0), (0.5, 2.0), (-np.inf, 1e-2), (-1e-2, np.inf),
           (-1e-9, 1e-9), (-70000.0, 70000.0), (3e-8, 3e-8), (-1e-40, 1e-40)]
_bounds = st.sampled_from(_BOUNDS)


@needs_kernel
@settings(max_examples=200, deadline=None)
@given(half_chunks(), st.sampled_from([None, np.float32, np.float64]), _bounds, st.integers(0, 2**32 - 1))
def test_clip_values_equals_clip_by_value_and_its_counts(case, widened, bounds, seed):
    """clip_values gives ``clipping.clip_by_value``'s values bit for bit (the bounds rounded to the
    dtype as NumPy rounds them, NaN kept with its payload, ±inf clipped), the count ``_changed`` takes
    (NaN to NaN unchanged) and the NaN and ±inf count the "error" policy looks for; float32, float64,
    float16 and bfloat16, bounds that round to zero, to each other, past float16's range (float64: the
    half values, every other one with noise in its low bits, so that values fall between bounds float32
    would merge)."""
    from gradtool.clip_dump import _fused_clip_values
    from gradtool.core.clipping import clip_by_value
    from gradtool.io.base import TensorInfo

    kind, a, _ = case
    x = a if widened is None else a.astype(widened)
    if widened is np.float64:
        x[1::2] *= 1 + np.random.default_rng(seed).uniform(-1e-12, 1e-12, x[1::2].shape)  # (the others:
        # values equal to a bound stay there)
    lo, hi = (float(b) for b in bounds)
    with np.errstate(all="ignore"):
        want = clip_by_value(x, lo, hi, nonfinite="propagate", xp=np)
        changed = int(np.count_nonzero((x != want) & ~(np.isnan(x) & np.isnan(want))))
    clip = _fused_clip_values(TensorInfo("t", x.shape, x.dtype), lo, hi)
    out = np.full_like(x, 7)
    got, odd = clip(x, out)
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize]
    assert np.array_equal(out.view(bits), np.asarray(want).view(bits))
    assert got == changed and odd == int(np.count_nonzero(~np.isfinite(x)))


@needs_kernel
@pytest.mark.parametrize("kind, dtype", HALF_KINDS)
@pytest.mark.parametrize("bounds", _BOUNDS + [(-0.0, -0.0), (-2.0, -0.5), (-np.inf, np.inf), (-np.inf, -np.inf),
                                              (np.inf, np.inf), (-1e-45, 6e-8), (-6e-8, 0.0), (0.0, 1e300)])
def test_clip_values_of_every_half_value(kind, dtype, bounds):
    """Every one of the 65,536 float16 or bfloat16 values (both zeros, subnormals, ±inf, every NaN
    payload) clipped by the kernel, which compares their bits, is ``clip_by_value``'s NumPy result bit for
    bit, with its counts; bounds of both zeros, of one sign, infinite, subnormal."""
    from gradtool.clip_dump import _fused_clip_values
    from gradtool.core.clipping import clip_by_value
    from gradtool.io.base import TensorInfo

    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    lo, hi = (float(b) for b in bounds)
    with np.errstate(all="ignore"):
        want = np.asarray(clip_by_value(x, lo, hi, nonfinite="propagate", xp=np))
        changed = int(np.count_nonzero((x != want) & ~(np.isnan(x) & np.isnan(want))))
    clip = _fused_clip_values(TensorInfo("t", x.shape, x.dtype), lo, hi)
    out = np.full_like(x, 7)
    got, odd = clip(x, out)
    assert np.array_equal(out.view(np.uint16), want.view(np.uint16))
    assert got == changed and odd == int(np.count_nonzero(~np.isfinite(x.astype(np.float32))))


@needs_kernel
def test_clip_values_declines_what_clip_by_value_refuses_or_does_not_take():
    """NaN bounds, lo > hi, array bounds, other dtypes (big-endian floats too): no kernel (clip_by_value's
    path, and its error); a buffer of another type than its kind says: a TypeError, nothing written."""
    from gradtool.clip_dump import _fused_clip_values
    from gradtool.io.base import TensorInfo

    f32 = TensorInfo("t", (3,), np.dtype(np.float32))
    assert _fused_clip_values(f32, -1.0, 1.0) is not None
    for lo, hi in ((float("nan"), 1.0), (-1.0, float("nan")), (1.0, -1.0), (np.float64(-1), 1.0)):
        assert _fused_clip_values(f32, lo, hi) is None
    for dtype in (np.int32, ">f4", ">f8", np.complex64):
        assert _fused_clip_values(TensorInfo("t", (3,), np.dtype(dtype)), -1.0, 1.0) is None
    with pytest.raises(ValueError, match="size"):
        kernels.compiled_clip_values(np.ones(3, np.float32), -1.0, 1.0, np.empty(4, np.float32), -1)
    for kind, wrong in ((-1, np.ones(3, np.float64)), (-2, np.ones(3, np.float32)), (-2, np.ones(3, ">f8")),
                        (-2, np.ones(6, np.float32))):  # (the last: float64's 24 bytes, not float64)
        with pytest.raises(TypeError, match="float"):
            kernels.compiled_clip_values(wrong, -1.0, 1.0, np.empty_like(wrong), kind)
    for kind in (-3, 2):
        with pytest.raises(ValueError, match="-2 .float64."):
            kernels.compiled_clip_values(np.ones(3, np.float32), -1.0, 1.0, np.empty(3, np.float32), kind)


def _f64_sum_sq_in_lanes(x):
    """Σx² in the order f64_summary states: element i into running sum i mod 8, each added up one element
    after another (np.cumsum adds in order), the eight sums combined ((q0+q1)+(q2+q3))+((q4+q5)+(q6+q7))."""
    with np.errstate(over="ignore", invalid="ignore"):
        q = [float(np.cumsum(x[j::8] * x[j::8])[-1]) if x[j::8].size else 0.0 for j in range(8)]
    return ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]))


_f64_specials = st.sampled_from([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 5e-324, 1.7e308, -1e-300])


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 70), st.sampled_from([0, 1, 4096, 100_003]), st.sampled_from([1e-200, 1e-5, 1.0, 1e150]),
       st.lists(_f64_specials, max_size=3), st.integers(0, 2**32 - 1))
def test_f64_summary_is_its_stated_sum_and_max(short, long, scale, specials, seed):
    """f64_summary gives max |x| (NaN when an element is NaN, 0 for none) and Σx² in its stated order, bit
    for bit (lengths around the eight lanes, a tail of each length), within ~1e-13 of the exact sum."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(short + long) * scale
    for v in specials:
        if x.size:
            x[rng.integers(0, x.size)] = v
    amax, total = kernels.compiled_f64_summary(x)
    want_max = float(np.max(np.abs(x))) if x.size else 0.0
    assert repr(amax) == repr(want_max) or (math.isnan(amax) and math.isnan(want_max))
    want = _f64_sum_sq_in_lanes(x)
    assert repr(total) == repr(want) or (math.isnan(total) and math.isnan(want))
    exact = math.fsum(float(v) ** 2 for v in x.tolist()) if np.all(np.abs(x) < 1e150) else None
    if exact is not None and exact > 1e-280:
        assert math.isclose(total, exact, rel_tol=1e-13)


@needs_kernel
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5000), st.sampled_from([0.5, 1e-3, 3.0, 1e-310, 0.0, -0.25, 1e300, np.nan]),
       st.lists(_f64_specials, max_size=3), st.booleans(), st.integers(0, 2**32 - 1))
def test_f64_scale_is_numpys_product_measured_as_f64_summary(n, scale, specials, in_place, seed):
    """f64_scale writes NumPy's float64 product, bit for bit (in place too), counts the elements that
    changed as clip counts them (NaN to NaN unchanged, -0 == 0), and measures the output with
    f64_summary's bits."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
    for v in specials:
        if n:
            x[rng.integers(0, n)] = v
    x[rng.random(n) < 0.1] = 0.0
    with np.errstate(all="ignore"):
        want = x * np.float64(scale)
        changed = int(np.count_nonzero((x != want) & ~(np.isnan(x) & np.isnan(want))))
    src = x.copy()
    out = src if in_place else np.full_like(x, 7.0)
    amax, total, got = kernels.compiled_f64_scale(src, scale, out)
    if math.isnan(scale) and n:  # (which of two NaN operands a product keeps is the compiler's choice: clip
        assert np.isnan(out).all() and got == changed  # never scales by NaN in the kernel)
        assert math.isnan(amax) and math.isnan(total)
    else:
        assert out.view(np.uint64).tolist() == want.view(np.uint64).tolist() and got == changed
        assert repr((amax, total)) == repr(kernels.compiled_f64_summary(want))
    assert in_place or src.view(np.uint64).tolist() == x.view(np.uint64).tolist()  # the input untouched


@needs_kernel
@pytest.mark.parametrize("offset", range(8))
def test_f64_kernels_read_and_write_unaligned_views(offset):
    """A float64 view at any byte offset (NumPy's unaligned views: a member of a zip, a slice of bytes) is
    measured and scaled as its aligned copy is, the bytes around it untouched."""
    x = np.random.default_rng(offset).standard_normal(1001)
    x[7] = np.nan
    raw = bytearray(8 * 1001 + 16)
    view = np.frombuffer(raw, np.float64, 1001, offset)
    view[:] = x
    assert view.flags.aligned == (offset == 0)
    assert repr(kernels.compiled_f64_summary(view)) == repr(kernels.compiled_f64_summary(x))
    out_raw = bytearray(b"\xab" * (8 * 1001 + 16))
    out = np.frombuffer(out_raw, np.float64, 1001, (offset + 3) % 8)
    want = kernels.compiled_f64_scale(x, 0.25, np.empty_like(x))
    assert repr(kernels.compiled_f64_scale(view, 0.25, out)) == repr(want)
    assert out.tobytes() == (x * 0.25).tobytes()
    start = (offset + 3) % 8
    assert out_raw[:start] == b"\xab" * start and out_raw[start + 8 * 1001:] == b"\xab" * (16 - start)


@needs_kernel
def test_f64_kernels_refuse_what_they_do_not_take():
    """Buffers of another type or byte order, not contiguous, of another size, not writable: an error,
    nothing read or written."""
    for bad in (np.ones(3, np.float32), np.ones(3, ">f8"), np.ones((4, 4))[:, 0], np.ones(3, np.int64)):
        with pytest.raises((TypeError, BufferError, ValueError), match="float64|C-contiguous|buffer"):
            kernels.compiled_f64_summary(bad)
        out = np.full(bad.size, 7.0)
        with pytest.raises((TypeError, BufferError, ValueError), match="float64|C-contiguous|buffer"):
            kernels.compiled_f64_scale(bad, 0.5, out)
        assert np.all(out == 7.0)
    with pytest.raises(ValueError, match="size"):
        kernels.compiled_f64_scale(np.ones(3), 0.5, np.empty(4))
    with pytest.raises(BufferError):
        kernels.compiled_f64_scale(np.ones(3), 0.5, np.empty(3).tobytes())  # not writable


def test_disabled_turns_off_every_entry_point():
    """``kernels.disabled()`` (and GRADTOOL_NO_KERNELS) set every ``compiled_*`` entry point to None, so a
    test of a NumPy path cannot reach the kernel through one that was forgotten; all come back after."""
    names = {n for n in dir(kernels) if n.startswith("compiled_")}
    assert names == set(kernels.COMPILED)
    before = {n: getattr(kernels, n) for n in names}
    with kernels.disabled():
        assert all(getattr(kernels, n) is None for n in names)
    assert {n: getattr(kernels, n) for n in names} == before
