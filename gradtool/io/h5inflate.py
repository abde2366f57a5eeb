"""gzip-compressed HDF5 datasets inflated on two cores, with the same result as h5py's one-core read.

h5py inflates a chunked dataset's chunks one after another on one core. Every HDF5 chunk is its own
deflate stream, so here each chunk's stored bytes are read with ``pread`` at the file offset HDF5 reports
and inflated (by zlib, or python-isal's faster zlib when installed: :mod:`.inflate`; both release the
GIL) on worker threads, a few bands of chunk rows ahead of the consumer. The consumer gets exactly the
blocks of whole first-axis rows the h5py path yields (the same boundaries, the same values), so
statistics and clipping give the same bits either way.

Only the plain pipelines are taken: deflate, optionally after shuffle, every chunk written, no filter
skipped, a band of chunk rows of at most ``MAX_BAND_BYTES``. Anything else (fletcher32, szip, lzf,
partial edge chunks left unwritten, column-shaped chunks) goes through h5py.
"""

from __future__ import annotations

import math
import os
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from ..errors import InputError
from .inflate import decompress_exactly

WORKERS = 2
MAX_BAND_BYTES = 16 << 20  # one band of chunk rows, inflated (bigger bands: h5py's path)
AHEAD_BYTES = 32 << 20  # inflated bytes in flight ahead of the consumer (keeps both workers busy)


@dataclass(frozen=True, slots=True)
class DeflatePlan:
    """Where a dataset's chunks are: chunk shape, whether shuffled, and per chunk index (its position in
    the chunk grid) the (file offset, stored size) of its deflate stream."""

    shape: tuple[int, ...]
    chunk: tuple[int, ...]
    shuffle: bool
    chunks: Mapping[tuple[int, ...], tuple[int, int]]

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunk))


class OneChunk(Mapping):
    """The chunks of a dataset stored as one chunk, as a mapping: its one place in the chunk grid ->
    (file offset, stored size), without a dict's ~180 bytes (an index of 20,000 small gzip datasets held
    3.5 MB of one-entry dicts)."""

    __slots__ = ("place", "where")

    def __init__(self, place: tuple[int, ...], where: tuple[int, int]) -> None:
        self.place, self.where = place, where

    def __getitem__(self, key: tuple[int, ...]) -> tuple[int, int]:
        if key != self.place:
            raise KeyError(key)
        return self.where

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        yield self.place

    def __len__(self) -> int:
        return 1


def compact_chunks(chunks: dict[tuple[int, ...], tuple[int, int]]) -> Mapping[tuple[int, ...], tuple[int, int]]:
    """``chunks`` as a :class:`OneChunk` when it holds one chunk, else as it is."""
    if len(chunks) == 1:
        ((place, where),) = chunks.items()
        return OneChunk(place, where)
    return chunks


def deflate_plan(dsid: Any, shape: tuple[int, ...], itemsize: int) -> DeflatePlan | None:
    """The plan for a chunked dataset this module can read, else None (h5py reads it)."""
    import h5py

    if not shape or math.prod(shape) == 0:
        return None
    try:
        dcpl = dsid.get_create_plist()
        if dcpl.get_layout() != h5py.h5d.CHUNKED:
            return None
        codes = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())]
        if codes not in ([h5py.h5z.FILTER_DEFLATE], [h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_DEFLATE]):
            return None
        chunk = tuple(int(c) for c in dcpl.get_chunk())
        if len(chunk) != len(shape) or not in_bands(shape, chunk, itemsize):
            return None
        chunks: dict[tuple[int, ...], tuple[int, int]] = {}
        unusable = []

        def visit(info: Any) -> None:
            if info.filter_mask != 0 or info.byte_offset is None:
                unusable.append(info)  # a filter skipped for this chunk, or no storage
            else:
                chunks[tuple(o // c for o, c in zip(info.chunk_offset, chunk))] = (info.byte_offset, info.size)

        if hasattr(dsid, "chunk_iter"):
            dsid.chunk_iter(visit)
        else:  # HDF5 < 1.14
            for i in range(dsid.get_num_chunks()):
                visit(dsid.get_chunk_info(i))
    except Exception:
        return None
    plan = DeflatePlan(tuple(shape), chunk, len(codes) == 2, chunks)
    if unusable or len(chunks) != math.prod(plan.grid) or len(chunks) < 2:
        return None  # unwritten chunks read as the fill value: h5py knows it; one chunk: nothing to share
    return plan


def in_bands(shape: tuple[int, ...], chunk: tuple[int, ...], itemsize: int) -> bool:
    """Whether a band of chunk rows of a dataset of ``shape`` in chunks of ``chunk`` is at most
    MAX_BAND_BYTES (:func:`iter_row_blocks` holds one)."""
    return chunk[0] * math.prod(shape[1:]) * itemsize <= MAX_BAND_BYTES


def inflate_whole(fd: int, plan: DeflatePlan, dtype: np.dtype, where: str) -> np.ndarray:
    """The whole dataset of ``plan``, its chunks inflated one after another on this thread (for a dataset
    of a few chunks, or a thread of a pool that reads many datasets at once): a new array of the plan's
    shape (the chunk's array itself, read-only unless shuffled, when one chunk is the dataset)."""
    if len(plan.chunks) == 1 and plan.chunk == plan.shape:
        return inflate_chunk(fd, plan, (0,) * len(plan.shape), dtype, where)
    out = np.empty(plan.shape, dtype)
    for key in product(*(range(g) for g in plan.grid)):
        dst = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(key, plan.chunk, plan.shape))
        out[dst] = inflate_chunk(fd, plan, key, dtype, where)[tuple(slice(0, d.stop - d.start) for d in dst)]
    return out


def inflate_chunk(fd: int, plan: DeflatePlan, key: tuple[int, ...], dtype: np.dtype, where: str) -> np.ndarray:
    """One chunk, whole (edge chunks are stored at full size), as an array of the chunk's shape."""
    offset, size = plan.chunks[key]
    return inflated(fd, offset, size, math.prod(plan.chunk), dtype, plan.shuffle, where).reshape(plan.chunk)


def inflated(fd: int, offset: int, size: int, count: int, dtype: np.dtype, shuffle: bool,
             where: str) -> np.ndarray:
    """The ``count`` elements of ``dtype`` that the deflate stream of ``size`` bytes at ``offset`` of
    ``fd`` (an HDF5 chunk) holds, HDF5's shuffle undone when ``shuffle``, as a new 1-D array; a one-line
    error naming ``where`` for a stream that is cut short, corrupt or of another length."""
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise InputError(f"{where}: truncated (a compressed chunk ends past the end of the file)")
    nbytes = count * dtype.itemsize
    try:
        raw = decompress_exactly(data, nbytes)
    except zlib.error as exc:
        raise InputError(f"{where}: corrupt compressed chunk ({exc})") from None
    if raw is None:
        raise InputError(f"{where}: a compressed chunk does not inflate to the {nbytes} bytes of its "
                         "elements")
    a = np.frombuffer(raw, np.uint8)
    if shuffle and dtype.itemsize > 1:  # HDF5's shuffle stores byte k of every element together
        a = np.ascontiguousarray(a.reshape(dtype.itemsize, -1).T)
    return a.view(dtype)


def iter_row_blocks(fd: int, plan: DeflatePlan, dtype: np.dtype, rows_per_block: int, where: str) -> Iterator[np.ndarray]:
    """The dataset as flat blocks of ``rows_per_block`` first-axis rows (the last block shorter), in
    order; a block is valid until the next is requested. Chunks are inflated by WORKERS threads, bands
    of chunk rows submitted up to AHEAD_BYTES ahead."""
    from concurrent.futures import ThreadPoolExecutor

    shape, chunk, grid = plan.shape, plan.chunk, plan.grid
    tail_keys = list(product(*(range(g) for g in grid[1:])))
    band_nbytes = chunk[0] * math.prod(shape[1:]) * dtype.itemsize
    ahead = max(2, AHEAD_BYTES // max(band_nbytes, 1))
    band_buf = np.empty((chunk[0],) + shape[1:], dtype)
    block = np.empty((rows_per_block,) + shape[1:], dtype)
    filled = 0
    pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="gradtool-inflate")
    pending: deque[list[tuple[tuple[int, ...], Any]]] = deque()
    try:
        next_band = 0

        def submit_until(limit: int) -> None:
            nonlocal next_band
            while next_band < min(limit, grid[0]):
                b = next_band
                pending.append([(k, pool.submit(inflate_chunk, fd, plan, (b,) + k, dtype, where)) for k in tail_keys])
                next_band += 1

        for b in range(grid[0]):
            submit_until(b + 1 + ahead)
            futures = pending.popleft()
            height = min(chunk[0], shape[0] - b * chunk[0])
            band = band_buf[:height]
            for k, fut in futures:
                arr = fut.result()
                dst = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(k, chunk[1:], shape[1:]))
                src = (slice(0, height),) + tuple(slice(0, d.stop - d.start) for d in dst)
                band[(slice(None),) + dst] = arr[src]
            pos = 0
            while pos < height:
                take = min(rows_per_block - filled, height - pos)
                block[filled: filled + take] = band[pos: pos + take]
                filled += take
                pos += take
                if filled == rows_per_block:
                    yield block.reshape(-1)
                    filled = 0
        if filled:
            yield block[:filled].reshape(-1)
    finally:
        for futures in pending:
            for _, fut in futures:
                fut.cancel()
        pool.shutdown(wait=True)
