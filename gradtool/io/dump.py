"""Open and save dumps in any supported format: the entry points the commands and the library use."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any


from ..errors import InputError, UsageError
from .atomic import atomic_output
from .base import DumpReader, DumpWriter, TensorInfo, check_tensor_name, check_unique
from .detect import detect_format, format_from_extension, output_format


def _spool_stdin() -> str:
    """Standard input copied to a temporary file (dumps need random access); removed on close."""
    import shutil
    import tempfile  # here, not at the top: with shutil ~10 ms of every command's start-up

    fd, tmp = tempfile.mkstemp(prefix="gradtool-stdin-")
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
    except BaseException:  # Ctrl-C while a slow producer streams gigabytes: no copy left in the temp dir
        os.unlink(tmp)
        raise
    return tmp


_stdin_copy: str | None = None  # within stdin_spooled(): the copy that open_dump("-") opens


@contextmanager
def stdin_spooled() -> Iterator[str]:
    """Standard input copied once to a temporary file, removed when the block ends. For a command that must
    look at its standard input before it knows what it is (a dump or a training log): within the block
    ``open_dump("-")`` opens this copy instead of reading standard input again (which would be empty)."""
    global _stdin_copy
    if _stdin_copy is not None:
        raise RuntimeError("standard input is already spooled")
    tmp = _spool_stdin()
    _stdin_copy = tmp
    try:
        yield tmp
    finally:
        _stdin_copy = None
        try:
            os.unlink(tmp)
        except OSError:
            pass


def stdin_copy_path() -> str | None:
    """The file standard input is spooled to within :func:`stdin_spooled`, else None."""
    return _stdin_copy


def open_dump(path: str, *, group: str | None = None, format: str | None = None) -> DumpReader:
    """Open one dump lazily (only its index is read). ``path`` may be ``-`` for standard input.

    The format is detected from the file's first bytes; ``format`` forces it. ``group`` selects one step
    group of a multi-step HDF5 file.
    """
    display = path
    temp = None
    if path == "-":
        display = "<stdin>"
        if _stdin_copy is not None:
            path = _stdin_copy
        else:
            temp = path = _spool_stdin()
    try:
        if not os.path.exists(path):
            raise InputError(f"{display}: no such file")
        if os.path.isdir(path):
            raise InputError(f"{display}: is a directory")
        fmt = format or detect_format(path)
        if fmt is None:
            ext = format_from_extension(display)
            what = f"does not look like a {ext} file" if ext else "is not a gradient dump"
            raise InputError(f"{display}: {what} (unrecognised content; formats: .npz .npy .h5 .safetensors)")
        reader = _reader(fmt, path, display, group)
    except BaseException:
        if temp:
            os.unlink(temp)
        raise
    if temp:
        reader.close = _and_remove(reader.close, temp)  # type: ignore[method-assign]
    return reader


def _and_remove(close: Any, temp: str) -> Any:
    def closer() -> None:
        close()
        try:
            os.unlink(temp)
        except OSError:
            pass

    return closer


def _reader(fmt: str, path: str, display: str, group: str | None) -> DumpReader:
    if fmt == "npz":
        from .npz import NpzReader

        return NpzReader(path, display_path=display)
    if fmt == "npy":
        from .npy import NpyReader

        return NpyReader(path, display_path=display)
    if fmt == "hdf5":
        from .hdf5 import Hdf5Reader

        return Hdf5Reader(path, group=group, display_path=display)
    if fmt == "safetensors":
        from .safetensors import SafetensorsReader

        return SafetensorsReader(path, display_path=display)
    raise UsageError(f"unknown dump format {fmt!r}")


def make_writer(path: str, fmt: str, metadata: Mapping[str, Any] | None = None, *, compress: bool = False) -> DumpWriter:
    """A writer of format ``fmt`` at ``path`` (normally a temporary path from :func:`atomic_output`)."""
    meta = dict(metadata or {})
    if fmt == "npz":
        from .npz import NpzWriter

        return NpzWriter(path, meta, compress=compress)
    if fmt == "npy":
        from .npy import NpyWriter

        return NpyWriter(path, meta)
    if fmt == "hdf5":
        from .hdf5 import Hdf5Writer

        return Hdf5Writer(path, meta)
    if fmt == "safetensors":
        from .safetensors import SafetensorsWriter

        return SafetensorsWriter(path, meta)
    raise UsageError(f"unknown dump format {fmt!r}")


def save_dump(path: str, tensors: Mapping[str, Any] | Iterable[tuple[str, Any]], metadata: Mapping[str, Any] | None = None,
              *, format: str | None = None, force: bool = False, compress: bool = False) -> str:
    """Write a dump atomically (temp file + fsync + rename). Refuses to replace a file unless ``force``.

    ``tensors`` maps names to array-likes (NumPy arrays, or anything with ``__array__``/``__dlpack__``).
    The format is ``format`` or the one ``path``'s extension names. Returns the path written.
    """
    from ..recorder import to_numpy

    fmt = format or output_format(path, None)
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    arrays = [(check_tensor_name(str(n), path), to_numpy(a, str(n))) for n, a in items]
    check_unique([n for n, _ in arrays], path)
    infos = [TensorInfo(n, tuple(a.shape), a.dtype) for n, a in arrays]
    with atomic_output(path, force=force) as tmp:
        with make_writer(tmp, fmt, metadata, compress=compress) as w:
            w.plan(infos)
            for info, (_, a) in zip(infos, arrays):
                w.add(info, a)
    return path
