"""Where a plain HDF5 dataset keeps its data (contiguous, or gzip chunks), read from its object header.

Opening a dataset through h5py costs ~100 us (``H5Dopen``, the dataspace, type and layout wrappers,
``H5Dclose``): 15-20 ms for a 148-dataset dump, as much as summarising a fifth of its 500 MB. For the one
case that needs nothing more, this module reads the dataset's object header at the address ``H5Ovisit``
reports and takes its shape, dtype and data offset from three messages (HDF5 File Format Specification,
version 3, sections IV.A.1.a, IV.A.2.b, IV.A.2.d and IV.A.2.i).

It is deliberately narrow, and anything else is None, so that h5py opens the dataset as before:

* a version-1 object header whose messages all lie in the header block (no continuation);
* besides the dataspace, datatype and layout, only NIL padding and the fill-value message h5py writes
  by default (``FILL_VALUE_DEFAULT``, byte for byte): attributes, other filters, external files, times,
  shared or committed types, any other fill value and everything unknown send it back (h5py then also
  validates them, as HDF5 does on open);
* a simple or scalar dataspace (version 1 or 2), rank <= 32;
* a datatype byte-equal to one of the common types as HDF5 writes them (``COMMON_TYPES``: IEEE
  little-endian floats, little-endian integers);
* a version-3 layout message of class contiguous, with a defined address and exactly the size the
  shape and dtype give.

The same narrow reading finds a gzip dataset's chunks (:func:`read_dataset`), as h5py writes every
``create_dataset(..., compression="gzip")`` of up to 64 chunks (all but the largest tensors of a
compressed dump): a version-3 chunked layout message, a version-1 filter pipeline (IV.A.2.l) of deflate,
after shuffle or not, the fill-value message h5py writes for it, and a version-1 B-tree of its chunks
(III.A.1) that is one leaf holding every chunk of the grid, none with a filter skipped: each chunk's file
offset and stored size. Opening a dataset through HDF5 cost ~100 us, and HDF5 2.0 keeps ~5-15 kB for
each dataset a file has opened until the process ends (20,000 gzip datasets read: 375 MB).

The reader cross-checks its first result of each kind in each file against h5py and stops using this
module for that file if they differ; every offset is also checked against the file's size before it is
read.
"""

from __future__ import annotations

import functools
import math
import os
import struct
from typing import NamedTuple

import numpy as np

MAX_HEADER = 1 << 16  # a dataset header without attributes is a few hundred bytes
FIRST_READ = 512
UNDEFINED_ADDRESS = (1 << 64) - 1

NIL, DATASPACE, DATATYPE, FILL_VALUE, LAYOUT, FILTERS = 0x0000, 0x0001, 0x0003, 0x0005, 0x0008, 0x000B
# version 2, space allocated late, fill value written if set, fill value defined (the library's default), no
# value of its own: what h5py writes for every dataset without a fill value (seen in every test file)
FILL_VALUE_DEFAULT = bytes.fromhex("0202020100000000")
FILL_VALUE_CHUNKED = bytes.fromhex("0203020100000000")  # the same, space allocated as chunks are written
DEFLATE, SHUFFLE = 1, 2  # HDF5's filter identifiers
SHARED = 0x02  # message flag: the message lives elsewhere (a committed datatype, a shared message)

# The datatype message bodies HDF5 writes for these types (class and version, bit fields, size, properties),
# up to their padding; tests/io/test_h5header.py checks them against files h5py writes.
COMMON_TYPES: tuple[tuple[bytes, np.dtype], ...] = tuple((bytes.fromhex(body), np.dtype(code))
                                                         for body, code in (
    ("11201f00" "04000000" "0000" "2000" "17" "08" "00" "17" "7f000000", "<f4"),
    ("11203f00" "08000000" "0000" "4000" "34" "0b" "00" "34" "ff030000", "<f8"),
    ("11200f00" "02000000" "0000" "1000" "0a" "05" "00" "0a" "0f000000", "<f2"),
    ("10080000" "08000000" "0000" "4000", "<i8"),
    ("10080000" "04000000" "0000" "2000", "<i4"),
    ("10080000" "02000000" "0000" "1000", "<i2"),
    ("10080000" "01000000" "0000" "0800", "i1"),
    ("10000000" "01000000" "0000" "0800", "u1"),
    ("10000000" "02000000" "0000" "1000", "<u2"),
    ("10000000" "04000000" "0000" "2000", "<u4"),
    ("10000000" "08000000" "0000" "4000", "<u8"),
))


PARSED_BODIES = 4096  # dataspace, datatype and filter messages parsed once each (most datasets of a dump
# repeat a few: the same dtype, filters and shapes)
_SHARED: dict[tuple[int, ...], tuple[int, ...]] = {}
SHARED_TUPLES = 1 << 14  # shapes, chunk shapes and chunk places kept to be shared (at most this many)


def shared(t: tuple[int, ...]) -> tuple[int, ...]:
    """The one tuple kept equal to ``t`` (``t`` itself the first time, while fewer than SHARED_TUPLES are
    kept): a dump's layers share their shapes, and nearly every small dataset's one chunk is at (0,) or
    (0, 0). An index of 20,000 gzip datasets held ~3.5 MB of copies of a few thousand tuples."""
    got = _SHARED.get(t)
    if got is None:
        if len(_SHARED) >= SHARED_TUPLES:
            return t
        got = _SHARED[t] = t
    return got


@functools.lru_cache(maxsize=PARSED_BODIES)
def parse_dataspace(body: bytes) -> tuple[int, ...] | None:
    """The current dimensions of a dataspace message (version 1 or 2), or None (null, unknown, short)."""
    if len(body) < 4:
        return None
    version, rank, flags = body[0], body[1], body[2]
    if rank > 32 or flags & ~0x01:  # bit 0: maximum dimensions follow; bit 1 (permutations) never used
        return None
    if version == 1:
        start = 8
    elif version == 2:
        if body[3] == 0:  # scalar
            return () if rank == 0 else None
        if body[3] != 1:  # null (or unknown): h5py's path reports it
            return None
        start = 4
    else:
        return None
    if len(body) < start + 8 * rank:
        return None
    return shared(struct.unpack_from(f"<{rank}Q", body, start))


@functools.lru_cache(maxsize=PARSED_BODIES)
def parse_datatype(body: bytes) -> np.dtype | None:
    for prefix, dtype in COMMON_TYPES:
        if body[: len(prefix)] == prefix:
            return dtype
    return None


def parse_layout(body: bytes) -> tuple[int, int] | None:
    """(address, size) of a version-3 contiguous layout message, or None."""
    if len(body) < 18 or body[0] != 3 or body[1] != 1:
        return None
    address, size = struct.unpack_from("<QQ", body, 2)
    return None if address == UNDEFINED_ADDRESS else (address, size)


def parse_chunked_layout(body: bytes, shape: tuple[int, ...],
                         itemsize: int) -> tuple[int, tuple[int, ...]] | None:
    """(address of the chunk B-tree, chunk shape) of a version-3 chunked layout message of a dataset of
    ``shape`` (elements of ``itemsize`` bytes), or None; also for chunks larger than the dataset along
    an axis (a dataset resized smaller: an edge chunk, inflated whole, could outgrow the dataset)."""
    rank = len(shape)
    if not rank or len(body) < 11 + 4 * (rank + 1) or body[0] != 3 or body[1] != 2 or body[2] != rank + 1:
        return None
    (address,) = struct.unpack_from("<Q", body, 3)
    dims = struct.unpack_from(f"<{rank + 1}I", body, 11)
    if (address == UNDEFINED_ADDRESS or dims[rank] != itemsize or not all(dims[:rank])
            or any(c > n for c, n in zip(dims, shape))):
        return None
    return address, shared(dims[:rank])


@functools.lru_cache(maxsize=PARSED_BODIES)
def parse_filters(body: bytes, itemsize: int) -> tuple[bool, int] | None:
    """(shuffle, level) of a version-1 filter pipeline message of deflate alone or shuffle (of
    ``itemsize``-byte elements) then deflate, or None."""
    if len(body) < 8 or body[0] != 1:
        return None
    filters = []
    pos = 8
    for _ in range(body[1]):
        if pos + 8 > len(body):
            return None
        ident, name_length, flags, values = struct.unpack_from("<HHHH", body, pos)
        pos += 8 + -(-name_length // 8) * 8  # (the name, padded to 8 bytes)
        if flags & ~0x0001 or pos + 4 * values > len(body):  # bit 0: optional; anything else unknown
            return None
        filters.append((ident, struct.unpack_from(f"<{values}I", body, pos)))
        pos += 4 * (values + values % 2)  # (the values, padded to 8 bytes)
    if pos > len(body):
        return None
    if [i for i, _ in filters] == [DEFLATE] and len(filters[0][1]) == 1:
        return False, filters[0][1][0]
    if ([i for i, _ in filters] == [SHUFFLE, DEFLATE] and filters[0][1] == (itemsize,)
            and len(filters[1][1]) == 1):
        return True, filters[1][1][0]
    return None


def parse_chunk_leaf(node: bytes, shape: tuple[int, ...],
                     chunk: tuple[int, ...]) -> dict[tuple[int, ...], tuple[int, int]] | None:
    """The chunks of a dataset of ``shape`` in chunks of ``chunk``, by their place in the chunk grid ->
    (file offset, stored size), from its version-1 B-tree when that is one leaf node (``node``: its bytes)
    holding every chunk of the grid, none with a filter skipped; else None."""
    rank = len(shape)
    key = 8 + 8 * (rank + 1)
    if len(node) < 24 or node[:4] != b"TREE" or node[4] != 1 or node[5] != 0:
        return None
    entries, left, right = struct.unpack_from("<HQQ", node, 6)
    grid = tuple(-(-n // c) for n, c in zip(shape, chunk))
    if (entries != math.prod(grid) or left != UNDEFINED_ADDRESS or right != UNDEFINED_ADDRESS
            or len(node) < 24 + entries * (key + 8) + key):
        return None
    chunks: dict[tuple[int, ...], tuple[int, int]] = {}
    for i in range(entries):
        at = 24 + i * (key + 8)
        size, mask = struct.unpack_from("<II", node, at)
        offsets = struct.unpack_from(f"<{rank + 1}Q", node, at + 8)
        (address,) = struct.unpack_from("<Q", node, at + key)
        place = shared(tuple(o // c for o, c in zip(offsets, chunk)))
        if (mask or size == 0 or address == UNDEFINED_ADDRESS or offsets[rank]
                or any(o % c or o >= n for o, c, n in zip(offsets, chunk, shape)) or place in chunks):
            return None
        chunks[place] = (address, size)
    return chunks  # (as many distinct places in the grid as it has: all of them)


class Contiguous(NamedTuple):
    """A dataset whose ``shape`` x ``dtype`` elements lie as they are at file offset ``offset``."""

    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int


class Deflated(NamedTuple):
    """A gzip dataset: its elements in chunks of shape ``chunk`` (edge chunks stored whole), each one deflate
    stream of the chunk's bytes (after HDF5's shuffle filter when ``shuffle``), at gzip ``level``; ``tree``
    the address of the chunk B-tree, ``chunks`` each chunk's place in the chunk grid -> (file offset,
    stored size) (None until read: :func:`read_dataset`)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunk: tuple[int, ...]
    shuffle: bool
    level: int
    tree: int
    chunks: dict[tuple[int, ...], tuple[int, int]] | None = None


def parse_header(head: bytes) -> Contiguous | Deflated | None:
    """What the bytes of a version-1 object header say of a contiguous dataset (:class:`Contiguous`) or of
    a gzip one (:class:`Deflated`, its chunks not read), or None. ``head`` holds the 16-byte prefix and
    at least the header's message block."""
    if len(head) < 16 or head[0] != 1:
        return None
    count = struct.unpack_from("<H", head, 2)[0]
    end = 16 + struct.unpack_from("<I", head, 8)[0]
    if end > len(head):
        return None
    found: dict[int, bytes] = {}
    pos = 16
    for _ in range(count):
        if pos + 8 > end:
            return None
        kind, size, flags = struct.unpack_from("<HHB", head, pos)
        body = head[pos + 8: pos + 8 + size]
        if len(body) < size or pos + 8 + size > end:
            return None
        pos += 8 + size
        if kind in (DATASPACE, DATATYPE, LAYOUT, FILTERS, FILL_VALUE):
            if flags & SHARED or kind in found:
                return None
            found[kind] = body
        elif kind != NIL:
            return None  # attributes, external files, continuation, times, unknown
    shape = parse_dataspace(found[DATASPACE]) if DATASPACE in found else None
    dtype = parse_datatype(found[DATATYPE]) if DATATYPE in found else None
    if shape is None or dtype is None or LAYOUT not in found:
        return None
    if FILTERS not in found:
        layout = parse_layout(found[LAYOUT])
        if (layout is None or layout[1] != math.prod(shape) * dtype.itemsize
                or found.get(FILL_VALUE, FILL_VALUE_DEFAULT) != FILL_VALUE_DEFAULT):
            return None
        return Contiguous(shape, dtype, layout[0])
    deflate = parse_filters(found[FILTERS], dtype.itemsize)
    chunked = parse_chunked_layout(found[LAYOUT], shape, dtype.itemsize)
    if (deflate is None or chunked is None or not math.prod(shape)
            or found.get(FILL_VALUE, FILL_VALUE_CHUNKED) != FILL_VALUE_CHUNKED):
        return None
    return Deflated(shape, dtype, chunked[1], deflate[0], deflate[1], chunked[0])


LEAF_READ = 2048  # a chunk B-tree leaf of up to 64 chunks (HDF5's default) of a 1-D dataset in one pread


def read_dataset(fd: int, address: int, file_size: int) -> Contiguous | Deflated | None:
    """What :func:`parse_header` says of the dataset whose object header is at ``address`` of ``fd``, read
    with one or two ``pread``s, and for a gzip dataset its chunks (:func:`parse_chunk_leaf`), read with
    one or two more; None for any other dataset, and when the header or any data would lie beyond the
    end of the file (``file_size``)."""
    if address < 0 or address + 16 > file_size:
        return None
    head = os.pread(fd, FIRST_READ, address)
    if len(head) >= 16 and head[0] == 1:
        end = 16 + struct.unpack_from("<I", head, 8)[0]
        if len(head) < end <= MAX_HEADER and address + end <= file_size:
            head = os.pread(fd, end, address)
    found = parse_header(head)
    if isinstance(found, Contiguous):
        return None if found.offset + math.prod(found.shape) * found.dtype.itemsize > file_size else found
    if found is None or found.tree >= file_size:
        return None
    node = os.pread(fd, LEAF_READ, found.tree)
    if len(node) >= 8 and node[:4] == b"TREE":
        key = 8 + 8 * (len(found.shape) + 1)  # (a leaf: its entries, each a key and an address, then a key)
        size = 24 + struct.unpack_from("<H", node, 6)[0] * (key + 8) + key
        if len(node) < size <= MAX_HEADER:
            node = os.pread(fd, size, found.tree)
    chunks = parse_chunk_leaf(node, found.shape, found.chunk)
    if chunks is None or any(offset + size > file_size for offset, size in chunks.values()):
        return None
    return found._replace(chunks=chunks)


def read_contiguous(fd: int, address: int, file_size: int) -> Contiguous | None:
    """:func:`read_dataset` of a contiguous dataset, else None."""
    found = read_dataset(fd, address, file_size)
    return found if isinstance(found, Contiguous) else None
