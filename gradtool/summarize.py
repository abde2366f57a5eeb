"""Statistics of whole dumps and histories, one tensor in memory at a time (the library behind `stats`)."""

from __future__ import annotations

import fnmatch
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from .backend import dtype_name, is_floating_dtype, is_numpy_namespace, to_device
from .core import kernels
from .core.norms import ROW, bfloat16_bits_as_float32, combine_norms, parse_norm_type
from .core.kernels import kernel_kind
from .core.stats import STREAM_CHUNK, StatsAccumulator, TensorStats, one_chunk_stats, tensor_stats
from .errors import InputError
from .io.base import LOSS_KEYS, LR_KEYS, DumpReader, PhasedBuffer, TensorInfo, bits_view


def name_selected(name: str, select: Sequence[str] = (), exclude: Sequence[str] = ()) -> bool:
    """True when ``name`` matches a ``select`` glob (or there are none) and no ``exclude`` glob."""
    if select and not any(fnmatch.fnmatchcase(name, g) for g in select):
        return False
    return not any(fnmatch.fnmatchcase(name, g) for g in exclude)


@dataclass
class DumpSummary:
    """One dump's statistics. ``global_norm`` is over its floating tensors, in ``norm_type``."""

    path: str
    format: str
    group: str | None
    step: int | None
    norm_type: float
    metadata: dict[str, Any]
    tensors: list[tuple[str, TensorStats]] = field(default_factory=list)
    shards: list[str] | None = None  # the shard files of a sharded step

    @property
    def global_norm(self) -> float:
        return combine_norms((s.norm for _, s in self.tensors if s.is_float), self.norm_type)

    @property
    def num_tensors(self) -> int:
        return len(self.tensors)

    @property
    def num_elements(self) -> int:
        return sum(s.size for _, s in self.tensors)

    @property
    def nonfinite_tensors(self) -> list[str]:
        return [n for n, s in self.tensors if s.nonfinite_count]

    @property
    def largest(self) -> tuple[str | None, float | None]:
        """(name, norm) of the float tensor with the largest norm (NaN counts as largest)."""
        best: tuple[str | None, float | None] = (None, None)
        for n, s in self.tensors:
            if not s.is_float:
                continue
            if best[1] is None or s.norm != s.norm or (best[1] == best[1] and s.norm > best[1]):
                best = (n, s.norm)
        return best


def summarize_dump(reader: DumpReader, *, step: int | None = None, select: Sequence[str] = (),
                   exclude: Sequence[str] = (), norm_type: float | int | str = 2, xp: ModuleType | None = None,
                   on_tensor: Callable[[int], None] | None = None) -> DumpSummary:
    """Per-tensor statistics of the selected tensors of one dump, reading one tensor at a time."""
    p = parse_norm_type(norm_type)
    summary = DumpSummary(reader.display_path, reader.format, reader.group,
                          step if step is not None else reader.step, p, dict(reader.metadata))
    if getattr(reader, "shards", None) is not None:
        summary.shards = [s.display_path for s in reader.shards]
    on_host = xp is None or is_numpy_namespace(xp)
    if on_host and getattr(reader, "compressed", False):
        return _summarize_compressed(reader, summary, select, exclude, p, on_tensor)
    if on_host and _summarize_parallel(reader, summary, select, exclude, p, on_tensor):
        return summary
    infos = [i for i in reader.tensors if name_selected(i.name, select, exclude)]
    batched: dict[int, TensorStats | None] = {}
    if on_host:  # small tensors many at a time (one kernel call a batch), the others streamed
        for batch in small_tensor_batches(reader, infos, p):
            batched.update(batch_stats(reader, batch, p))
    for k, info in enumerate(infos):
        if on_host:  # stream through a small buffer: memory does not grow with the tensor
            summary.tensors.append((info.name, batched.get(k) or streamed_stats(reader, info, p)))
        else:
            x = to_device(reader.read(info.name), xp)
            summary.tensors.append((info.name, tensor_stats(x, p, xp=xp)))
            del x
        if on_tensor:
            on_tensor(1)
    return summary


STATS_WORKERS = 2  # this machine class has two cores; more threads only add hand-offs
PIECE_BYTES = 16 << 20  # a piece of work: 16 MiB of stream chunks, one kernel call (8 MiB measured 0.77-0.88
# of raw read, 16 MiB 0.82-0.88, 32 MiB 0.84-0.88; 4 MiB 0.64-0.73: GIL round trips)
PARALLEL_MIN_BYTES = 32 << 20  # below this, thread start-up costs more than a second core gains


def stats_in_parallel(reader: DumpReader, infos: Sequence[TensorInfo], norm_type: float = 2.0,
                      on_tensor: Callable[[int], None] | None = None) -> list[tuple[str, TensorStats]] | None:
    """Statistics of exactly these tensors on two cores (see :func:`_summarize_parallel`, and
    :func:`_summarize_compressed` for a compressed npz), or None when that path does not apply (too
    small, bytes not at a file offset): then stream them."""
    summary = DumpSummary(reader.display_path, reader.format, reader.group, reader.step, parse_norm_type(norm_type), {})
    if getattr(reader, "compressed", False):  # deflated members: inflated two at a time
        _summarize_compressed(reader, summary, (), (), summary.norm_type, on_tensor, infos=list(infos))
        return summary.tensors
    if not _summarize_parallel(reader, summary, (), (), summary.norm_type, on_tensor, infos=list(infos)):
        return None
    return summary.tensors


def _summarize_parallel(reader: DumpReader, summary: DumpSummary, select: Sequence[str], exclude: Sequence[str],
                        p: float, on_tensor: Callable[[int], None] | None,
                        infos: list[TensorInfo] | None = None) -> bool:
    """Statistics on two cores: every tensor is cut into pieces of about PIECE_BYTES (whole stream chunks),
    each piece summarised into its own :class:`StatsAccumulator` by a worker thread (reads and the compiled
    kernel release the GIL; one kernel call per piece; without the kernel, NumPy's passes over each chunk
    release it too), and the pieces of a tensor merged in order. Merging is exact
    for counts, extremes and the per-chunk sums of squares, so norms have the same bits as one thread;
    mean and std are combined with Chan's formula. A sharded step's tensors are their shards' pieces in
    order, as one thread streams them. False (nothing done) when a selected tensor's bytes cannot be read
    at an offset (:meth:`DumpReader.raw_segments`), or the dump is too small to gain."""
    workers = min(STATS_WORKERS, os.cpu_count() or 1)
    if infos is None:
        infos = [i for i in reader.tensors if name_selected(i.name, select, exclude)]
    if workers < 2 or sum(i.size * i.dtype.itemsize for i in infos) < PARALLEL_MIN_BYTES:
        return False
    # per tensor: the (reader, piece, location) runs of bytes that make it up, in order. A run the kernel
    # reads takes its stored CRC-32 (an npz member's) in the same pass: those are asked for first, so that
    # the checks made for the others stop at them (see NpzReader.location_checked_by_caller)
    fuse_crc = kernels.compiled_crc32_combine is not None
    by_kernel = [fuse_crc and _read_in_kernel(p, info) for info in infos]
    segments: list[Any] = [None] * len(infos)
    for k in sorted(range(len(infos)), key=lambda k: not by_kernel[k]):
        segments[k] = reader.raw_segments(infos[k], crc_by_caller=by_kernel[k])
        if segments[k] is None:
            return False
    seeds = {(k, j): seed for k, segs in enumerate(segments) if by_kernel[k]
             for j, (source, piece, _) in enumerate(segs) if (seed := source.crc_seed(piece)) is not None}

    def piece_elements(info: TensorInfo) -> int:
        return max(1, PIECE_BYTES // (STREAM_CHUNK * info.dtype.itemsize)) * STREAM_CHUNK

    batches = small_tensor_batches(reader, infos, p, segments)  # small tensors: many to a task, one kernel call
    batched = {k for batch in batches for k, *_ in batch}
    owed = {k: (*segments[k][0][:2], seed) for (k, _), seed in seeds.items() if k in batched}
    pieces = [(k, j, start, min(start + piece_elements(seg[1]), seg[1].size))
              for k, segs in enumerate(segments) if k not in batched for j, seg in enumerate(segs)
              for start in range(0, seg[1].size, piece_elements(seg[1]))]

    local = threading.local()  # one read buffer per thread (for small or unaligned non-float32 data)

    def work(piece: tuple[int, int, int, int]) -> tuple[StatsAccumulator, int | None]:
        k, j, start, stop = piece
        seed = seeds.get((k, j))  # a run's first piece continues the seed; the others start at 0, joined below
        return _piece_accumulator(*segments[k][j], start, stop, p, local,
                                  crc=None if seed is None else seed if start == 0 else 0)

    def inline(piece: tuple[int, int, int, int]) -> bool:  # see SMALL_PIECE_ELEMENTS
        return piece[3] - piece[2] < SMALL_PIECE_ELEMENTS

    from concurrent.futures import ThreadPoolExecutor

    accs = {k: StatsAccumulator(p) for k in range(len(infos)) if k not in batched}
    crcs: dict[tuple[int, int], int] = {}  # (tensor, run) -> the CRC-32 of its pieces so far, in order
    left = [0] * len(infos)
    for k, *_ in pieces:
        left[k] += 1
    done = 0

    batch_of: dict[int, Any] = {}  # tensor -> the future of its batch's statistics
    batch_got: dict[Any, dict[int, TensorStats | None]] = {}  # a batch's, once its future is done (a
    # future's result() takes a lock: 20,000 tensors' took 0.17 s)

    def finish(k: int) -> None:
        info = infos[k]
        if k in batch_of:
            future = batch_of[k]
            got = batch_got.get(future)
            if got is None:
                got = batch_got[future] = future.result()
            stats = got[k] or streamed_stats(reader, info, p)
        else:
            for j, (source, piece, _) in enumerate(segments[k]):  # (no statistics from bytes not yet checked)
                if (k, j) in seeds:
                    source.settle_crc(piece, crcs[k, j])
            stats = accumulated_stats(accs[k], info)
        summary.tensors.append((info.name, stats))
        if on_tensor:
            on_tensor(1)

    pool = ThreadPoolExecutor(workers, thread_name_prefix="gradtool-stats")
    try:
        for batch in batches:
            future = pool.submit(batch_stats, reader, batch, p, owed)
            batch_of.update((k, future) for k, *_ in batch)
        futures = iter([pool.submit(work, piece) for piece in pieces if not inline(piece)])
        for piece in pieces:  # in order: small pieces summarised here while the workers read the big ones
            k, j, start, stop = piece
            acc, crc = work(piece) if inline(piece) else next(futures).result()
            if crc is not None:
                crcs[k, j] = crc if start == 0 else kernels.compiled_crc32_combine(
                    crcs[k, j], crc, (stop - start) * infos[k].dtype.itemsize)
            while done < k:  # empty tensors (no pieces) before this one
                finish(done)
                done += 1
            accs[k].merge(acc)
            left[k] -= 1
            if left[k] == 0:
                finish(k)
                done = k + 1
        while done < len(infos):
            finish(done)
            done += 1
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return True


SMALL_PIECE_ELEMENTS = ROW  # a piece this small is summarised by the thread that merges the results (a
# float32 one by the kernel, others from one pread). GPT-2's 98 bias and norm tensors of 768-3072 elements
# each cost a pool task, a kernel call and a second read when the workers took them: summarising
# in-process 8-14 % faster on all four GPT-2 files (40 alternations in one process)


def _read_in_kernel(p: float, info: TensorInfo) -> bool:
    """Whether a tensor at a file offset is read and summarised by ``f32_summaries_fd`` (float32, float16
    or bfloat16, the compiled kernel built, a norm other than L1, which needs the data)."""
    return (kernels.compiled_f32_summaries_fd is not None and p != 1.0
            and kernel_kind(info.dtype) is not None)


def _summarise_in_kernel(acc: StatsAccumulator, source: DumpReader, info: TensorInfo,
                         location: tuple[int, int], start: int, stop: int, crc: int | None = None) -> int | None:
    """Float32 (or float16/bfloat16, widened to float32) elements [start, stop) of a run of a tensor's bytes
    into ``acc``: read and summarised chunk by chunk (STREAM_CHUNK elements from ``start``) in C through a
    cache-resident buffer, no GIL held, one call for the run (``f32_summaries_fd``); the same chunks, so the
    same bits, as ``iter_chunks``. With ``crc``: returns ``zlib.crc32(those bytes, crc)``, taken in the
    same pass."""
    fd, offset = location
    kind = kernel_kind(info.dtype)
    try:
        if crc is None:
            summaries = kernels.compiled_f32_summaries_fd(fd, offset + start * info.dtype.itemsize, stop - start,
                                                          STREAM_CHUNK, kind)
        else:
            summaries, crc = kernels.compiled_f32_summaries_fd(fd, offset + start * info.dtype.itemsize,
                                                               stop - start, STREAM_CHUNK, kind, crc)
    except EOFError:
        raise InputError(f"{source.display_path}: tensor {info.name!r} is truncated") from None
    except OSError as exc:
        raise InputError(f"{source.display_path}: cannot read tensor {info.name!r} "
                         f"({exc.strerror or exc})") from None

    bits = bits_view(info)

    def chunk_at(i: int) -> np.ndarray:  # the rare chunk whose data is needed after all (a bfloat16 tensor
        a = start + i * STREAM_CHUNK  # taken as its bits: its float32 values, which it is summarised as)
        window = next(source.range_window(location, info, a, min(a + STREAM_CHUNK, stop), view_as=bits))
        return np.array(window) if bits is None else bfloat16_bits_as_float32(window)

    acc.update_summaries(summaries, STREAM_CHUNK, stop - start, chunk_at)
    return crc


def _piece_accumulator(source: DumpReader, info: TensorInfo, location: tuple[int, int], start: int, stop: int,
                       p: float, local: threading.local, crc: int | None = None
                       ) -> tuple[StatsAccumulator, int | None]:
    """Elements [start, stop) of one run of a tensor's bytes, summarised, and with ``crc`` (a tensor read by
    the kernel only) the CRC-32 of those bytes continued from it. float32: by :func:`_summarise_in_kernel`;
    other dtypes: one memory-map window (or a pread into this thread's buffer, always for a piece under
    SMALL_PIECE_ELEMENTS) and ``update_window``."""
    acc = StatsAccumulator(p)
    if _read_in_kernel(p, info):
        return acc, _summarise_in_kernel(acc, source, info, location, start, stop, crc)
    assert crc is None, "a CRC is taken by the kernel's reads only"
    small = stop - start < SMALL_PIECE_ELEMENTS
    buffer = getattr(local, "buffer", None)  # this thread's read buffer (it grows to the largest piece)
    if buffer is None:
        buffer = local.buffer = PhasedBuffer()
    for window in source.range_window(location, info, start, stop, buffer, copy=small):
        acc.update_window(window.view(np.int8) if info.dtype == np.bool_ else window, STREAM_CHUNK)
        del window
    return acc, None


BATCH_BYTES = 4 << 20  # the small tensors of one kernel call (tensor_summaries_fd): a 20,000-tensor dump in
# ~60 calls, shared by both threads


def small_tensor_batches(reader: DumpReader, infos: Sequence[TensorInfo], p: float,
                         segments: Sequence[Any] | None = None) -> list[list[tuple[int, TensorInfo, int, int, int]]]:
    """The tensors of ``infos`` summarised many to a kernel call, as batches of (index in ``infos``, info,
    file descriptor, byte offset, kind) of at most about BATCH_BYTES, one file each: float32, float16 and
    bfloat16 tensors of 1 to STREAM_CHUNK elements (one chunk) whose bytes lie at one file offset. Empty
    when the compiled kernel is not built. ``segments``: each info's ``raw_segments``, when known."""
    if kernels.compiled_tensor_summaries_fd is None or p == 1.0:
        return []
    batches: list[list[tuple[int, TensorInfo, int, int, int]]] = []
    batch: list[tuple[int, TensorInfo, int, int, int]] = []
    size = 0
    for k, info in enumerate(infos):
        if not (0 < info.size <= STREAM_CHUNK and _read_in_kernel(p, info)):
            continue
        runs = reader.raw_segments(info) if segments is None else segments[k]
        if runs is None or len(runs) != 1:
            continue
        fd, offset = runs[0][2]
        if batch and (size >= BATCH_BYTES or batch[-1][2] != fd):
            batches.append(batch)
            batch, size = [], 0
        batch.append((k, info, fd, offset, kernel_kind(info.dtype)))
        size += info.size * info.dtype.itemsize
    if batch:
        batches.append(batch)
    return batches


def batch_stats(reader: DumpReader, batch: Sequence[tuple[int, TensorInfo, int, int, int]], p: float,
                crc_owed: dict[int, tuple[DumpReader, TensorInfo, int]] | None = None
                ) -> dict[int, TensorStats | None]:
    """Statistics of a batch of :func:`small_tensor_batches`, by index: read and summarised in one
    ``tensor_summaries_fd`` call (no GIL held), then :func:`~gradtool.core.stats.one_chunk_stats` for all
    of them at once; the same bits as streaming each. None where the summary does not decide (NaN/inf,
    extreme values, a dominating mean) or where the read failed: the caller streams those tensors, which
    reads their data (or reports the error with the file named). ``crc_owed``: index -> (reader, piece,
    CRC-32 seed) of the tensors whose stored CRC the caller took over (:meth:`DumpReader.crc_seed`): taken
    in the same call and settled, before their statistics are made, for those read."""
    items = np.array([(offset, info.size, kind) for _, info, _, offset, kind in batch], np.int64)
    out = np.empty((len(batch), 5))
    owed = [crc_owed.get(k) for k, *_ in batch] if crc_owed else []
    crcs = np.array([0 if o is None else o[2] for o in owed], np.uint32) if any(owed) else None
    failed = kernels.compiled_tensor_summaries_fd(batch[0][2], items, out, *([] if crcs is None else [crcs]))
    done = len(batch) if failed < 0 else failed
    if crcs is not None:
        for i in range(done):
            if owed[i] is not None:
                owed[i][0].settle_crc(owed[i][1], int(crcs[i]))
    stats = one_chunk_stats(out[:done], items[:done, 1].tolist(), [info.shape for _, info, *_ in batch[:done]],
                            [dtype_name(info.dtype) for _, info, *_ in batch[:done]], p)
    result: dict[int, TensorStats | None] = {k: None for k, *_ in batch}
    result.update((entry[0], s) for entry, s in zip(batch, stats))
    return result


DECOMPRESS_WORKERS = 2
DECOMPRESS_SLACK = 64 << 20  # inflated bytes allowed in memory beyond the largest selected tensor
INFLATE_WINDOW_BYTES = 8 << 20  # a streamed compressed member is summarised this many bytes at a time


def _summarize_compressed(reader: DumpReader, summary: DumpSummary, select: Sequence[str], exclude: Sequence[str],
                          p: float, on_tensor: Callable[[int], None] | None,
                          infos: list[TensorInfo] | None = None) -> DumpSummary:
    """Deflated npz members are inflate-bound (~0.3 GB/s a core) and a member inflates on one core, so
    two worker threads each inflate and summarise whole members (zlib and the kernel release the GIL),
    largest first so that one huge member overlaps all the others instead of finishing alone; results are
    put back in file order. A member is inflated into its worker's INFLATE_WINDOW_BYTES buffer and
    summarised a window at a time (the same chunks, so the same result, as :func:`tensor_stats` of the
    whole array; no tensor-sized allocation, whose first-touch page faults cost more than the copy).
    Members that are not deflated (stored beside deflated ones, or another compression) are read whole;
    a worker starts one only while the bytes in flight stay within the largest selected tensor +
    DECOMPRESS_SLACK (or when nothing else is in flight)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor, as_completed

    if infos is None:
        infos = [i for i in reader.tensors if name_selected(i.name, select, exclude)]
    sizes = [i.size * i.dtype.itemsize for i in infos]
    budget = max(sizes, default=0) + DECOMPRESS_SLACK
    cond = threading.Condition()
    in_flight = 0
    local = threading.local()  # one window buffer per worker thread

    def streamed(info: TensorInfo) -> TensorStats | None:
        if getattr(local, "buffer", None) is None:
            local.buffer = np.empty(INFLATE_WINDOW_BYTES // 8 + STREAM_CHUNK, np.float64).view(np.uint8)
        window = max(1, INFLATE_WINDOW_BYTES // (STREAM_CHUNK * info.dtype.itemsize)) * STREAM_CHUNK
        chunks = reader.inflated_chunks(info, window, local.buffer)
        return None if chunks is None else chunks_stats(chunks, info, p)

    def work(k: int) -> TensorStats:
        nonlocal in_flight
        result = streamed(infos[k]) if hasattr(reader, "inflated_chunks") else None
        if result is not None:
            return result
        with cond:
            cond.wait_for(lambda: in_flight == 0 or in_flight + sizes[k] <= budget)
            in_flight += sizes[k]
        try:
            return tensor_stats(reader._read(infos[k]), p)
        finally:
            with cond:
                in_flight -= sizes[k]
                cond.notify_all()

    def work_on(ks: list[int]) -> list[tuple[int, TensorStats]]:
        return [(k, work(k)) for k in ks]

    def work_on_small(ks: list[int]) -> list[tuple[int, TensorStats]]:
        got = inflated_small_stats(reader, [infos[k] for k in ks], p)
        return [(k, s if s is not None else work(k)) for k, s in zip(ks, got)]

    small = _small_members(reader, infos, p)
    results: list[TensorStats | None] = [None] * len(infos)
    pool = ThreadPoolExecutor(DECOMPRESS_WORKERS, thread_name_prefix="gradtool-inflate")
    try:
        rest = [k for k in range(len(infos)) if k not in small]  # (the largest first, the small ones after)
        futures = [pool.submit(work_on, [rest[j] for j in js]) for js in _member_jobs([sizes[k] for k in rest])]
        futures += [pool.submit(work_on_small, ks) for ks in _small_member_jobs(small, sizes)]
        for fut in as_completed(futures):
            for k, result in fut.result():
                results[k] = result
                if on_tensor:
                    on_tensor(1)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    summary.tensors.extend((info.name, r) for info, r in zip(infos, results))  # type: ignore[misc]
    return summary


SMALL_MEMBER_JOB_BYTES = 1 << 20  # compressed members smaller than this go to the workers together


def _small_members(reader: DumpReader, infos: Sequence[TensorInfo], p: float) -> set[int]:
    """The members of ``infos`` (by index) that :func:`inflated_small_stats` takes: float32, float16 or
    bfloat16 of 1 to STREAM_CHUNK elements (one chunk), the compiled kernel built, a norm other than L1,
    a reader that inflates members whole (npz; HDF5, its gzip datasets)."""
    if (not hasattr(reader, "inflate_members") or p == 1.0 or kernels.compiled_f32_summaries is None
            or kernels.compiled_half_summaries is None):
        return set()
    return {k for k, info in enumerate(infos) if 0 < info.size <= STREAM_CHUNK and kernel_kind(info.dtype) is not None}


def _small_member_jobs(small: set[int], sizes: Sequence[int]) -> list[list[int]]:
    """The members of ``small`` in file order (the order of ``infos``) as :func:`grouped_jobs`:
    neighbours in the file, so that a job's members are read by one pread."""
    return grouped_jobs(sorted(small), sizes)


def grouped_jobs(ks: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    """``ks`` cut, in their order, into the workers' jobs: a job takes the next member while its members'
    inflated ``sizes`` stay within SMALL_MEMBER_JOB_BYTES and it has fewer than 1,024 (next fit), so a
    member of that size or more is a job alone (a future a member cost a lock's wait each: 20,000 members
    of 200 bytes, 1.9 s)."""
    jobs: list[list[int]] = []
    job: list[int] = []
    held = 0
    for k in ks:
        if job and (held + sizes[k] > SMALL_MEMBER_JOB_BYTES or len(job) >= 1024):
            jobs.append(job)
            job, held = [], 0
        job.append(k)
        held += sizes[k]
    if job:
        jobs.append(job)
    return jobs


def inflated_small_stats(reader: Any, infos: Sequence[TensorInfo], p: float) -> list[TensorStats | None]:
    """Statistics of small deflated members (see :func:`_small_members`), inflated whole by the reader's
    ``inflate_members`` and each summarised as ONE chunk by the kernel (``f32_summaries`` /
    ``half_summaries`` with the chunk the whole tensor: the ``summarize_kind`` of ``tensor_summaries_fd``,
    so the bits of streaming it), then :func:`one_chunk_stats` for all at once; where the summary does not
    decide, :func:`chunks_stats` of the inflated bytes (the data, in file order, as ``inflated_chunks``
    gives it). None for a member the reader could not inflate: the caller streams it, which reports the
    error."""
    datas = reader.inflate_members(infos)
    rows, which = [], []
    for i, (info, data) in enumerate(zip(infos, datas)):
        if data is None:
            continue
        kind = kernel_kind(info.dtype)
        if kind == -1:
            rows.append(kernels.compiled_f32_summaries(np.frombuffer(data, np.float32), info.size)[0])
        else:
            rows.append(kernels.compiled_half_summaries(np.frombuffer(data, np.uint16), info.size, kind)[0])
        which.append(i)
    out: list[TensorStats | None] = [None] * len(infos)
    if not which:
        return out
    picked = [infos[i] for i in which]
    got = one_chunk_stats(np.array(rows, np.float64), [i.size for i in picked], [i.shape for i in picked],
                          [dtype_name(i.dtype) for i in picked], p)
    for i, s in zip(which, got):
        info = infos[i]
        out[i] = s if s is not None else chunks_stats(iter([np.frombuffer(datas[i], info.dtype)]), info, p)
    return out


def _member_jobs(sizes: list[int]) -> list[list[int]]:
    """The members (their inflated ``sizes``) as the workers' jobs: largest first, as
    :func:`grouped_jobs` (so the big ones one a job, the small ones together)."""
    return grouped_jobs(sorted(range(len(sizes)), key=lambda k: -sizes[k]), sizes)


def accumulated_stats(acc: StatsAccumulator, info: TensorInfo) -> TensorStats:
    """The :class:`TensorStats` of tensor ``info`` from the accumulator its elements went into."""
    return acc.result(info.shape, dtype_name(info.dtype), is_floating_dtype(info.dtype))


def chunks_accumulator(chunks: Any, info: TensorInfo, norm_type: float = 2.0) -> StatsAccumulator:
    """A tensor's 1-D chunks (in order; each a whole number of STREAM_CHUNKs but the last) summarised
    into one :class:`StatsAccumulator` (bools as int8, as :func:`tensor_stats` sums them)."""
    acc = StatsAccumulator(norm_type)
    is_bool = info.dtype == np.bool_
    for chunk in chunks:
        acc.update_window(chunk.view(np.int8) if is_bool else chunk, STREAM_CHUNK)
    return acc


def chunks_stats(chunks: Any, info: TensorInfo, norm_type: float = 2.0) -> TensorStats:
    """:func:`tensor_stats` of a tensor given as its 1-D chunks (see :func:`chunks_accumulator`)."""
    return accumulated_stats(chunks_accumulator(chunks, info, norm_type), info)


def streamed_accumulator(reader: DumpReader, info: TensorInfo, norm_type: float = 2.0) -> StatsAccumulator:
    """A tensor read chunk by chunk from its file into a :class:`StatsAccumulator`: a float32 one of at
    most STREAM_CHUNK elements whose bytes lie at file offsets by :func:`_summarise_in_kernel`, one call
    per run of bytes (no Python per chunk: 55 against 74 us for a 256-element tensor), others from
    ``iter_chunks`` (a bigger tensor's aligned bytes are summarised where they are mapped, without the
    copy a read makes: 1.0 against 1.2 ms for 5 MB; but a bfloat16 one taken as its bits, whose chunks'
    values would need ml_dtypes: see :func:`~.io.base.bits_view`)."""
    p = parse_norm_type(norm_type)
    if (info.size <= STREAM_CHUNK or bits_view(info) is not None) and _read_in_kernel(p, info):
        segments = reader.raw_segments(info)
        if segments is not None:
            acc = StatsAccumulator(p)
            for source, piece, location in segments:
                _summarise_in_kernel(acc, source, piece, location, 0, piece.size)
            return acc
    return chunks_accumulator(reader.iter_chunks(info, STREAM_CHUNK), info, norm_type)


def streamed_stats(reader: DumpReader, info: TensorInfo, norm_type: float = 2.0) -> TensorStats:
    """:func:`tensor_stats` of a tensor read chunk by chunk from its file (the same accumulator)."""
    return accumulated_stats(streamed_accumulator(reader, info, norm_type), info)


@dataclass
class DumpHistory:
    """Per-step series from a history of dumps: the global norm, and each tensor's L2 norm and max |g|
    (float64 arrays, NaN at a step whose dump lacks the tensor)."""

    steps: list[int]
    global_norms: list[float]
    loss: list[float | None]
    lr: list[float | None]
    tensor_norms: dict[str, Any]
    tensor_max_abs: dict[str, Any]
    tensor_sizes: dict[str, int]
    repeated_steps: list[int] = field(default_factory=list)  # in several dumps: the one given last is used


@dataclass
class StepSeries:
    """What a history keeps of one dump's summary: its step, global norm, loss and learning rate, and
    each tensor's name, size, kind, L2 norm and max |g| (arrays), not every statistic of every tensor (a
    history of 32 dumps of 20,000 tensors held 0.5 GB of them). Names are shared between steps."""

    step: int | None
    global_norm: float
    loss: float | None
    lr: float | None
    names: list[str]
    sizes: Any  # int64
    is_float: Any  # bool
    norms: Any  # float64, NaN where a tensor has none
    max_abs: Any  # float64, 0 for an empty tensor

    @classmethod
    def of(cls, summary: DumpSummary, names: dict[str, str]) -> StepSeries:
        """``summary``'s series; ``names`` maps each name seen to the one string kept for it."""
        tensors = summary.tensors
        return cls(summary.step, summary.global_norm, metadata_number(summary.metadata, LOSS_KEYS),
                   metadata_number(summary.metadata, LR_KEYS), [names.setdefault(n, n) for n, _ in tensors],
                   np.array([t.size for _, t in tensors], dtype=np.int64),
                   np.array([t.is_float for _, t in tensors], dtype=bool),
                   np.array([np.nan if t.l2_norm is None else t.l2_norm for _, t in tensors], dtype=float),
                   np.array([0.0 if t.max_abs is None else t.max_abs for _, t in tensors], dtype=float))


def metadata_number(meta: dict[str, Any], keys: Sequence[str]) -> float | None:
    """The first of ``keys`` that a dump's metadata gives as a number (not a bool), or None."""
    for k in keys:
        v = meta.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def dump_history(refs: Sequence[Any], *, select: Sequence[str] = (), exclude: Sequence[str] = (),
                 xp: ModuleType | None = None, on_dump: Callable[[int], None] | None = None,
                 engine: str = "local", scheduler: str | None = None,
                 on_unreadable: Callable[[str, Any], None] | None = None) -> DumpHistory:
    """Read every dump once (one tensor at a time) and collect the series suggest-threshold needs, keeping
    of each dump only its :class:`StepSeries`.

    A tensor missing from some steps gets NaN there (it is then left out of those steps' statistics).
    ``engine="dask"`` reads the files on a Dask cluster (see :mod:`gradtool.engine`). ``on_unreadable``: as
    in :func:`~gradtool.engine.summarize_refs` (an unreadable dump is reported to it and left out). Refs
    without steps get their metadata's, else :func:`~gradtool.io.history.fallback_steps`'.
    """
    from .engine import each_summary, summarize_refs, with_fallback_steps

    kept: dict[str, str] = {}
    if engine == "local":
        read: list[Any] = [None] * len(refs)
        for i, summary in each_summary(refs, select=select, exclude=exclude, xp=xp, on_dump=on_dump,
                                       on_unreadable=on_unreadable):
            read[i] = StepSeries.of(summary, kept)
        rows = with_fallback_steps(refs, read)  # (anything with a step, as summaries)
    else:
        rows = [StepSeries.of(s, kept) for s in summarize_refs(
            refs, select=select, exclude=exclude, norm_type=2, xp=xp, engine=engine, scheduler=scheduler,
            on_dump=on_dump, on_unreadable=on_unreadable)]
    return history_of(rows)


def history_of(rows: list[StepSeries]) -> DumpHistory:
    """The :class:`DumpHistory` of dumps' series: in step order (stable), a step given twice keeping its
    dump given last; each tensor's series over the steps, the tensors in the order they first appear
    (a tensor is in the history when it is floating-point in some dump; its size is its first's)."""
    rows = sorted(rows, key=lambda s: s.step if s.step is not None else 0)
    last = {s.step: i for i, s in enumerate(rows) if s.step is not None}  # a step given twice: the later
    repeated = sorted({s.step for i, s in enumerate(rows) if s.step is not None and last[s.step] != i})
    if repeated:  # dump (a resumed run recorded again) replaces the earlier, as a later log does
        rows = [s for i, s in enumerate(rows) if s.step is None or last[s.step] == i]
    sizes: dict[str, int] = {}
    for s in rows:
        for n, size, floating in zip(s.names, s.sizes.tolist(), s.is_float.tolist()):
            if floating:
                sizes.setdefault(n, size)
    column = {n: j for j, n in enumerate(sizes)}
    norms = np.full((len(sizes), len(rows)), np.nan)  # a row per tensor: its series contiguous
    maxabs = np.full((len(sizes), len(rows)), np.nan)
    for i, s in enumerate(rows):
        at = np.array([column.get(n, -1) for n in s.names], dtype=np.intp)
        there = at >= 0
        norms[at[there], i], maxabs[at[there], i] = s.norms[there], s.max_abs[there]
    return DumpHistory(
        steps=[s.step if s.step is not None else i for i, s in enumerate(rows)],
        global_norms=[s.global_norm for s in rows], loss=[s.loss for s in rows], lr=[s.lr for s in rows],
        tensor_norms={n: norms[j] for n, j in column.items()},
        tensor_max_abs={n: maxabs[j] for n, j in column.items()}, tensor_sizes=sizes, repeated_steps=repeated,
    )
