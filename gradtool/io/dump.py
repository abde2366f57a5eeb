"""Open and save dumps in any supported format: the entry points the commands and the library use."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any


from ..errors import InputError, UsageError
from .atomic import atomic_output
from .base import DumpReader, DumpWriter, TensorInfo, check_tensor_name, check_unique, collector_paused
from .detect import detect_format, head_of, not_a_dump, output_format


def is_stream(path: str) -> bool:
    """True for an input that can be read only once, front to back: standard input (``-``), a named pipe,
    a shell's process substitution (``<(cmd)``, a ``/dev/fd/N`` pipe) or a socket. Not a character device:
    ``/dev/zero`` would be copied until the disk is full; read as a file, it is refused at its first bytes."""
    if path == "-":
        return True
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def stream_name(path: str) -> str:
    """How messages name a read-once input: ``<stdin>`` for ``-``, else its path."""
    return "<stdin>" if path == "-" else path


SNIFF_BYTES = 1 << 20  # a stream must show a dump format in these before the rest is copied


def _spool(path: str, dumps_only: bool = True) -> str:
    """A read-once input (:func:`is_stream`) copied to a temporary file, for dumps need random access.
    With ``dumps_only``, a stream whose first ``SNIFF_BYTES`` show no dump format is refused there, before
    gigabytes of something else (a log piped to ``stats``, ``yes |``) are copied. Without, such a stream
    is a training log, copied up to the log size limit only (an endless one would fill the disk)."""
    import shutil
    import tempfile  # here, not at the top: with shutil ~10 ms of every command's start-up

    name = stream_name(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix="gradtool-stdin-" if path == "-" else "gradtool-pipe-")
    except OSError as exc:
        raise InputError(f"{name}: cannot make a temporary copy in {tempfile.gettempdir()} "
                         f"({exc.strerror or exc}); set TMPDIR to a writable directory") from None
    try:
        try:
            src = sys.stdin.buffer if path == "-" else open(path, "rb")
        except OSError as exc:
            raise InputError(f"{name}: cannot read ({exc.strerror or exc})") from None
        with os.fdopen(fd, "wb") as out:
            try:
                head = src.read(SNIFF_BYTES)
                limit = None
                if head:
                    from .detect import not_a_dump, sniff_prefix

                    if sniff_prefix(head) is None:
                        if dumps_only:
                            raise InputError(f"{name}: {not_a_dump(head, name)}")
                        from .logs import MAX_LOG_BYTES as limit
                out.write(head)
                if limit is None:
                    shutil.copyfileobj(src, out, 1 << 20)
                else:
                    _copy_at_most(src, out, limit - len(head), f"{name}: log larger than {limit >> 30} GiB")
                out.flush()
            except OSError as exc:  # ENOSPC: a 20 GB dump piped into a small /tmp
                raise InputError(f"{name}: cannot copy it to {tempfile.gettempdir()} "
                                 f"({exc.strerror or exc}); set TMPDIR to a disk with room for the whole dump"
                                 ) from None
            finally:
                if path != "-":
                    src.close()
    except BaseException:  # Ctrl-C while a slow producer streams gigabytes: no copy left in the temp dir
        os.unlink(tmp)
        raise
    return tmp


def stdin_file() -> str | None:
    """The path of the regular file that standard input is redirected from (``gradtool stats - < x.npz``),
    when it can be opened by name as the same file from its start: read in place, not copied (a 20 GB dump
    would fill $TMPDIR). None for a pipe, a terminal, a device, a deleted file, or standard input already
    read into (its offset not 0)."""
    import stat

    try:
        fd = sys.stdin.fileno() if sys.stdin is not None else 0
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or os.lseek(fd, 0, os.SEEK_CUR) != 0:
            return None
        path = os.readlink(f"/proc/self/fd/{fd}")  # Linux; elsewhere the copy, as for a pipe
        named = os.stat(path)
    except (OSError, ValueError, AttributeError):  # no fileno (a test's stand-in stdin), no /proc
        return None
    return path if (named.st_dev, named.st_ino) == (st.st_dev, st.st_ino) else None


def _copy_at_most(src: Any, out: Any, limit: int, too_big: str) -> None:
    """Copy ``src`` to ``out``; InputError ``too_big`` once more than ``limit`` bytes came."""
    while (part := src.read(1 << 20)):
        limit -= len(part)
        if limit < 0:
            raise InputError(too_big)
        out.write(part)


_spooled: dict[str, str] = {}  # within streams_spooled(): read-once input -> the copy every open reads
_in_place: set[str] = set()  # the inputs of _spooled read in place (nothing to remove afterwards)


@contextmanager
def streams_spooled(inputs: Iterable[str], *, dumps_only: bool = True) -> Iterator[dict[str, str]]:
    """Each read-once input among ``inputs`` (:func:`is_stream`) copied once to a temporary file, removed
    when the block ends; yields {input: copy}. A command looks at a dump more than once (its format, its
    step groups, two passes of global-norm clipping) and must look at a stream before it knows whether it
    is a dump or a training log: within the block :func:`open_dump` and :func:`spooled_copy` give the
    copy, where a second read of the stream itself would find it empty. ``dumps_only=False`` (a command
    that also reads training logs) copies any content. Standard input redirected from a regular file is
    read in place instead (:func:`stdin_file`): its "copy" is that file, which is left alone."""
    if _spooled:
        raise RuntimeError("inputs are already spooled")
    try:
        for p in dict.fromkeys(inputs):
            if p == "-" and (redirected := stdin_file()) is not None:
                _spooled[p] = redirected
                _in_place.add(p)
            elif is_stream(p):
                _spooled[p] = _spool(p, dumps_only)
        yield dict(_spooled)
    finally:
        for p, copy in _spooled.items():
            if p in _in_place:
                continue  # the user's own file
            try:
                os.unlink(copy)
            except OSError:
                pass
        _spooled.clear()
        _in_place.clear()


def read_in_place(path: str) -> str | None:
    """The file that read-once input ``path`` is read from in place within :func:`streams_spooled` (standard
    input redirected from a regular file: :func:`stdin_file`), else None."""
    return _spooled.get(path) if path in _in_place else None


def spooled_copy(path: str) -> str | None:
    """The copy of read-once input ``path`` within :func:`streams_spooled`, else None."""
    return _spooled.get(path)


def open_dump(path: str, *, group: str | None = None, format: str | None = None) -> DumpReader:
    """Open one dump lazily (only its index is read). ``path`` may be ``-`` for standard input, or a pipe.

    The format is detected from the file's first bytes; ``format`` forces it. ``group`` selects one step
    group of a multi-step HDF5 file. A read-once input (standard input, a pipe) is read from its copy
    within :func:`streams_spooled`, else copied to a temporary file removed when the reader closes.
    """
    display = path
    temp = None
    if (copy := _spooled.get(path)) is not None:
        display, path = stream_name(path), copy
    elif is_stream(path):
        display = stream_name(path)
        temp = path = _spool(path)
    try:
        if not os.path.exists(path):
            raise InputError(f"{display}: no such file")
        if os.path.isdir(path):
            raise InputError(f"{display}: is a directory")
        fmt = format or detect_format(path)
        if fmt is None:
            raise InputError(f"{display}: {not_a_dump(head_of(path), display)}")
        with collector_paused():  # (an index of thousands of tensors: see collector_paused)
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
              *, format: str | None = None, force: bool = False, compress: bool = False,
              fsync: bool = True) -> str:
    """Write a dump atomically (temp file + fsync + rename). Refuses to replace a file unless ``force``.
    ``fsync=False`` skips the flush to disk (the rename stays atomic; a power cut may lose the file).

    ``tensors`` maps names to array-likes (NumPy arrays, or anything with ``__array__``/``__dlpack__``), or
    to nested mappings, lists and tuples of them (a JAX gradient pytree: names joined with "/"). The
    format is ``format`` or the one ``path``'s extension names. Returns the path written.

    Device tensors (PyTorch, CuPy, JAX) are copied to the host one at a time, as they are written: the
    host holds one tensor's copy, not the whole model's gradients.
    """
    from ..recorder import flatten_tensors, tensor_shape_and_dtype, to_numpy

    fmt = format or output_format(path, None)
    items = [(check_tensor_name(n, path), x) for n, x in flatten_tensors(tensors)]
    check_unique([n for n, _ in items], path)
    infos, converted = [], {}
    for n, x in items:
        known = tensor_shape_and_dtype(x)
        if known is None:  # TensorFlow, lists, ...: converted now to learn it
            converted[n] = to_numpy(x, n)
            known = (tuple(converted[n].shape), converted[n].dtype)
        infos.append(TensorInfo(n, *known))
    with atomic_output(path, force=force, durable=fsync, force_hint="force=True") as tmp:
        with make_writer(tmp, fmt, metadata, compress=compress) as w:
            w.plan(infos)
            for info, (n, x) in zip(infos, items):
                a = converted.pop(n) if n in converted else to_numpy(x, n)
                if (tuple(a.shape), a.dtype) != (info.shape, info.dtype):
                    raise UsageError(f"tensor {n!r} changed while it was written: {info.shape} {info.dtype} "
                                     f"became {tuple(a.shape)} {a.dtype}")
                w.add(info, a)
                del a  # before the next tensor's host copy
    return path
