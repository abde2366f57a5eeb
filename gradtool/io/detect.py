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
SQLITE_MAGIC = b"SQLite format 3\x00"  # mlflow.db: a training log, never a dump
WANDB_MAGIC = b":W&B" + struct.pack("<H", 0xBEE1)  # a W&B run log (then a version byte)


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


# leading bytes of files that are no gradient dump but are mistaken for one often enough to name
_TORCH_LEGACY = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"  # torch.save before 1.6: a pickled magic number
_COMPRESSORS = ((b"\x1f\x8b", "gzip", "gzip -dc"), (b"\x28\xb5\x2f\xfd", "zstd", "zstd -dc"),
                (b"\xfd7zXZ\x00", "xz", "xz -dc"), (b"BZh", "bzip2", "bzip2 -dc"))
NEVER_PICKLES = ("gradtool never loads pickles; save gradients with safetensors.torch.save_file, numpy.savez "
                 "or gradtool.Recorder")


def is_pickle(head: bytes) -> bool:
    """True when ``head`` starts as a pickle of protocol 2 to 5 does (the PROTO opcode)."""
    return head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05")


def compression(head: bytes) -> str | None:
    """The compressor (``gzip``, ``zstd``, ``xz``, ``bzip2``) whose magic bytes ``head`` starts with."""
    for magic, name, _ in _COMPRESSORS:
        if head.startswith(magic) and (name != "bzip2" or head[3:4] in b"123456789"):
            return name
    return None


def decompress_first(comp: str, name: str) -> str:
    """The advice for a ``comp``-compressed input ``name``: decompress it, or pipe it in decompressed."""
    cmd = next(c for _, n, c in _COMPRESSORS if n == comp)
    if name in ("-", "<stdin>"):
        return "decompress it first"
    return f"decompress it first, or pipe it in: {cmd} {name} | gradtool ... -"


def no_dumps_hint(directory: str, limit: int = 64) -> str:
    """What a directory that holds no gradient dumps holds instead, when it is recognisable, for the end of
    its one-line error: compressed dumps (``step_0.npz.gz``) or pickles (``grads_100.pt``); else "".
    Looks at the first 16 bytes of at most ``limit`` of its files."""
    from ..errors import listed

    try:
        names = sorted(n for n in os.listdir(directory) if not n.startswith("."))[:limit]
    except OSError:
        return ""
    found: dict[str, list[str]] = {}
    for n in names:
        p = os.path.join(directory, n)
        if os.path.isfile(p):
            head = head_of(p)
            pickled = is_pickle(head) or head.startswith(_TORCH_LEGACY)
            kind = compression(head) or ("pickle" if pickled else None)
            if kind and (kind == "pickle" or _compressed_dump(p, kind)):
                found.setdefault(kind, []).append(n)
    for kind, files in found.items():
        if kind == "pickle":
            return f"; it holds pickles ({listed(files, 2)}): {NEVER_PICKLES}"
        tool = next(c for _, k, c in _COMPRESSORS if k == kind).split()[0]
        return (f"; it holds {kind}-compressed files ({listed(files, 2)}): decompress them first "
                f"({tool} -dk {os.path.join(directory, '*')})")
    return ""


def _compressed_dump(path: str, kind: str) -> bool:
    """True when the ``kind``-compressed file ``path`` decompresses to a gradient dump (by its first bytes;
    zstd, not in the standard library before Python 3.14, is taken to be one)."""
    import bz2
    import gzip
    import lzma

    opener = {"gzip": gzip.open, "bzip2": bz2.open, "xz": lzma.open}.get(kind)
    if opener is None:
        return True
    try:
        with opener(path, "rb") as f:
            return sniff(f.read(16)) is not None
    except (OSError, EOFError, lzma.LZMAError):
        return False


def not_a_dump(head: bytes, name: str) -> str:
    """Why the file ``name`` that starts with ``head`` is no gradient dump, for a one-line error: what it
    is when it is something recognisable (a pickle, a compressed file) and what to do about it."""
    if not head:
        return "is empty (0 bytes: a dump still being written, or a save that failed)"
    if head.startswith(_TORCH_LEGACY):
        return f"is a PyTorch torch.save file (a pickle); {NEVER_PICKLES}"
    if is_pickle(head):
        return f"is a Python pickle; {NEVER_PICKLES}"
    if (comp := compression(head)) is not None:
        return f"is {comp}-compressed; {decompress_first(comp, name)}"
    if head.startswith(WANDB_MAGIC):
        return "is a W&B run log (suggest-threshold reads the gradient norms it logged)"
    if head.startswith(SQLITE_MAGIC):
        return ("is an SQLite database (an MLflow tracking store or a Trackio project? suggest-threshold "
                "reads the gradient norms its runs logged)")
    ext = format_from_extension(name)
    what = f"does not look like a {ext} file" if ext else "is not a gradient dump"
    if head and _is_text(head[:512]):
        return (f"{what} but text (a training log? suggest-threshold reads those; dumps are .npz .npy .h5 "
                ".safetensors)")
    return f"{what} (unrecognised content; formats: .npz .npy .h5 .safetensors)"


def _is_text(head: bytes) -> bool:
    """True when ``head`` reads as the start of UTF-8 text (a cut multi-byte character at its end allowed)."""
    if b"\0" in head or any(b < 32 and b not in b"\t\n\r\x0c\x1b" for b in head):
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start >= len(head) - 3 and exc.reason == "unexpected end of data"
    return True


def head_of(path: str, n: int = 16) -> bytes:
    """The first ``n`` bytes of ``path`` (empty when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


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
