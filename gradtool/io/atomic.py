"""Atomic output: write to a temporary file beside the target, fsync, then rename into place.

An interrupted run (Ctrl-C, SIGKILL, a full disk) leaves either no output or the previous file, never a
half-written one. Without ``force`` the final step is ``link()``, which fails if the target appeared in
the meantime, so two concurrent runs never clobber each other; with ``force`` it is ``rename()``, and the
last complete file wins. An input is never an output, even with ``force``.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from ..errors import ExitCode, OutputError

TMP_SUFFIX = ".gradtool-tmp"


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output_path(target: str, *, force: bool, inputs: Sequence[str] = ()) -> None:
    """Refuse an output that is one of the inputs (always) or that exists (unless ``force``)."""
    for src in inputs:
        if src != "-" and same_file(target, src):
            raise OutputError(f"{target}: refusing to overwrite an input file; choose another output",
                              exit_code=ExitCode.USAGE)
    if os.path.isdir(target):
        raise OutputError(f"{target}: is a directory; give a file name", exit_code=ExitCode.USAGE)
    if os.path.lexists(target) and not force:
        raise OutputError(f"{target}: already exists; pass --force to replace it", exit_code=ExitCode.USAGE)
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise OutputError(f"{target}: directory {parent} does not exist", exit_code=ExitCode.USAGE)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_output(target: str, *, force: bool = False, inputs: Sequence[str] = ()) -> Iterator[str]:
    """Yield a temporary path in the target's directory; on success move it to ``target`` atomically."""
    check_output_path(target, force=force, inputs=inputs)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=TMP_SUFFIX, dir=directory)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise OutputError(f"{target}: appeared while writing; pass --force to replace it",
                                  exit_code=ExitCode.USAGE) from None
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                    raise
                if os.path.lexists(target):
                    raise OutputError(f"{target}: appeared while writing; pass --force to replace it",
                                      exit_code=ExitCode.USAGE) from None
                os.replace(tmp, target)
            else:
                os.unlink(tmp)
        _fsync_dir(directory)
    except OSError as exc:
        _remove(tmp)
        if exc.errno == errno.ENOSPC:
            raise OutputError(f"{target}: no space left on device; nothing was written") from None
        raise OutputError(f"{target}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
