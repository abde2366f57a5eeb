"""Format detection from a file's first bytes (the extension only breaks ties and names outputs)."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import BinaryIO

from ..errors import InputError, UsageError

DUMP_FORMATS = ("npz", "npy", "hdf5", "safetensors")
EXTENSIONS = {
    ".npz": "npz", ".npy": "npy", ".h5": "hdf5", ".hdf5": "hdf5", ".hdf": "hdf5", ".safetensors": "safetensors",
    ".st": "safetensors",
}
FORMAT_EXTENSION = {"npz": ".npz", "npy": ".npy", "hdf5": ".h5", "safetensors": ".safetensors"}
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def sniff(head: bytes) -> str | None:
    """The dump format that these leading bytes announce, or None."""
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "npz"
    if head.startswith(HDF5_SIGNATURE):
        return "hdf5"
    if len(head) >= 9:
        (n,) = struct.unpack("<Q", head[:8])
        if 2 <= n <= 100 * 1024 * 1024 and head[8:9] == b"{":
            return "safetensors"
    return None


def _user_block_ends(size: int) -> Iterator[int]:
    """Where an HDF5 superblock may follow a user block in ``size`` bytes: 512, 1024, 2048, ... (the
    format puts it at byte 0 or at a power of two from 512; MATLAB v7.3 ``.mat`` files and
    ``h5py.File(userblock_size=...)`` have a user block). At most ~50 offsets for any size."""
    offset = 512
    while offset + len(HDF5_SIGNATURE) <= size:
        yield offset
        offset *= 2


def hdf5_after_user_block(f: BinaryIO) -> bool:
    """True when an HDF5 superblock follows a user block in file ``f`` (8 bytes read at each offset)."""
    for offset in _user_block_ends(os.fstat(f.fileno()).st_size):
        f.seek(offset)
        if f.read(8) == HDF5_SIGNATURE:
            return True
    return False


def sniff_prefix(prefix: bytes) -> str | None:
    """The dump format that the first bytes of a stream announce, HDF5 after a user block included when
    its superblock lies within ``prefix``; None when ``prefix`` shows no dump."""
    fmt = sniff(prefix[:16])
    if fmt is None and any(prefix[o:o + 8] == HDF5_SIGNATURE for o in _user_block_ends(len(prefix))):
        fmt = "hdf5"
    return fmt


def detect_format(path: str) -> str | None:
    """Read the first bytes of ``path`` and return its dump format (None if it is not a dump)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
            fmt = sniff(head)
            if fmt is None and os.path.isfile(path) and hdf5_after_user_block(f):
                fmt = "hdf5"
    except IsADirectoryError:
        return None
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror or exc})") from None
    return fmt


def format_from_extension(path: str) -> str | None:
    return EXTENSIONS.get(os.path.splitext(path)[1].lower())


def output_format(path: str, default: str | None) -> str:
    """The format to write: the one the output's extension names, else ``default`` (the input's)."""
    fmt = format_from_extension(path) or default
    if fmt is None:
        raise UsageError(f"{path}: cannot tell which format to write; use one of {', '.join(EXTENSIONS)}")
    return fmt
