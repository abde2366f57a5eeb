"""Where a plain contiguous HDF5 dataset keeps its data, read from its object header's bytes.

Opening a dataset through h5py costs ~100 us (``H5Dopen``, the dataspace, type and layout wrappers,
``H5Dclose``): 15-20 ms for a 148-dataset dump, as much as summarising a fifth of its 500 MB. For the one
case that needs nothing more, this module reads the dataset's object header at the address ``H5Ovisit``
reports and takes its shape, dtype and data offset from three messages (HDF5 File Format Specification,
version 3, sections IV.A.1.a, IV.A.2.b, IV.A.2.d and IV.A.2.i).

It is deliberately narrow, and anything else is None, so that h5py opens the dataset as before:

* a version-1 object header whose messages all lie in the header block (no continuation);
* besides the dataspace, datatype and layout, only NIL padding and the fill-value message h5py writes
  by default (``FILL_VALUE_DEFAULT``, byte for byte): attributes, filters, external files, times,
  shared or committed types, any other fill value and everything unknown send it back (h5py then also
  validates them, as HDF5 does on open);
* a simple or scalar dataspace (version 1 or 2), rank <= 32;
* a datatype byte-equal to one of the common types as HDF5 writes them (``COMMON_TYPES``: IEEE
  little-endian floats, little-endian integers);
* a version-3 layout message of class contiguous, with a defined address and exactly the size the
  shape and dtype give.

The reader cross-checks its first result in each file against h5py and stops using this module for that
file if they differ; every offset is also checked against the file's size before it is read.
"""

from __future__ import annotations

import math
import os
import struct

import numpy as np

MAX_HEADER = 1 << 16  # a dataset header without attributes is a few hundred bytes
FIRST_READ = 512
UNDEFINED_ADDRESS = (1 << 64) - 1

NIL, DATASPACE, DATATYPE, FILL_VALUE, LAYOUT = 0x0000, 0x0001, 0x0003, 0x0005, 0x0008
# version 2, space allocated late, fill value written if set, fill value defined (the library's default), no
# value of its own: what h5py writes for every dataset without a fill value (seen in every test file)
FILL_VALUE_DEFAULT = bytes.fromhex("0202020100000000")
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
    return struct.unpack_from(f"<{rank}Q", body, start)


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


def parse_header(head: bytes) -> tuple[tuple[int, ...], np.dtype, int] | None:
    """(shape, dtype, data address) from the bytes of a version-1 object header, or None. ``head`` holds the
    16-byte prefix and at least the header's message block."""
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
        if kind in (DATASPACE, DATATYPE, LAYOUT):
            if flags & SHARED or kind in found:
                return None
            found[kind] = body
        elif not (kind == NIL or (kind == FILL_VALUE and body == FILL_VALUE_DEFAULT)):
            return None  # attributes, filters, external files, continuation, other fill values, unknown
    if len(found) != 3:
        return None
    shape, dtype = parse_dataspace(found[DATASPACE]), parse_datatype(found[DATATYPE])
    layout = parse_layout(found[LAYOUT])
    if shape is None or dtype is None or layout is None:
        return None
    address, size = layout
    if size != math.prod(shape) * dtype.itemsize:
        return None
    return shape, dtype, address


def read_contiguous(fd: int, address: int, file_size: int) -> tuple[tuple[int, ...], np.dtype, int] | None:
    """:func:`parse_header` of the object header at ``address`` of ``fd``, read with one or two ``pread``s;
    None also when the header or its data would lie beyond the end of the file."""
    if address < 0 or address + 16 > file_size:
        return None
    head = os.pread(fd, FIRST_READ, address)
    if len(head) >= 16 and head[0] == 1:
        end = 16 + struct.unpack_from("<I", head, 8)[0]
        if len(head) < end <= MAX_HEADER and address + end <= file_size:
            head = os.pread(fd, end, address)
    found = parse_header(head)
    if found is None or found[2] + math.prod(found[0]) * found[1].itemsize > file_size:
        return None
    return found
