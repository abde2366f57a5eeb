"""Atomic output: write to a temporary file beside the target, fsync, then rename into place.

An interrupted run (Ctrl-C, SIGKILL, a full disk) leaves either no output or the previous file, never a
half-written one; the fsync before the rename extends that to a power failure or an OS crash. With
``durable=False`` (``gradtool clip --no-fsync``) nothing is flushed, as ``cp`` does: still atomic for
anything that happens to gradtool, but after a crash of the machine the output may be empty or partial.

Without ``force`` the final step is ``link()``, which fails if the target appeared in the meantime, so
two concurrent runs never clobber each other; with ``force`` it is ``rename()``, and the last complete
file wins. An input is never an output, even with ``force``.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, BinaryIO

from ..errors import ExitCode, OutputError

TMP_SUFFIX = ".gradtool-tmp"


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output_path(target: str, *, force: bool, inputs: Sequence[str] = (),
                      force_hint: str = "--force") -> None:
    """Refuse an output that is one of the inputs (always) or that exists (unless ``force``); ``force_hint``
    is how the caller's user asks to replace it (the commands' ``--force``, the library's ``force=True``)."""
    from .dump import read_in_place

    for src in inputs:
        src = read_in_place(src) or src  # `- < x.npz` is x.npz
        if src != "-" and same_file(target, src):
            raise OutputError(f"{target}: refusing to overwrite an input file; choose another output",
                              exit_code=ExitCode.USAGE)
    if os.path.isdir(target):
        raise OutputError(f"{target}: is a directory; give a file name", exit_code=ExitCode.USAGE)
    if os.path.lexists(target) and not force:
        raise OutputError(f"{target}: already exists; pass {force_hint} to replace it", exit_code=ExitCode.USAGE)
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise OutputError(f"{target}: directory {parent} does not exist", exit_code=ExitCode.USAGE)


@contextmanager
def output_directories() -> Iterator[Callable[[str], None]]:
    """A ``makedirs`` for a run's output directories that remembers which directories it created; when
    the run fails (an error, Ctrl-C), those still empty are removed again, deepest first, so a refused run
    leaves no empty directory behind (as a failed ``git clone`` does). A directory that existed before,
    or that holds anything, is never removed (``os.rmdir`` refuses it)."""
    made: list[str] = []

    def makedirs(path: str) -> None:
        missing = []
        p = os.path.abspath(path)
        while not os.path.isdir(p) and os.path.dirname(p) != p:
            missing.append(p)
            p = os.path.dirname(p)
        os.makedirs(path, exist_ok=True)
        made.extend(reversed(missing))

    try:
        yield makedirs
    except BaseException:
        for d in reversed(made):
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise


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
def atomic_output(target: str, *, force: bool = False, inputs: Sequence[str] = (),
                  durable: bool = True, force_hint: str = "--force") -> Iterator[str]:
    """Yield a temporary path in the target's directory; on success move it to ``target`` atomically
    (flushed to disk first unless ``durable`` is False). ``force_hint``: as in :func:`check_output_path`."""
    check_output_path(target, force=force, inputs=inputs, force_hint=force_hint)
    directory = os.path.dirname(os.path.abspath(target))
    # The name is chosen before the file exists (64 random bits; O_EXCL refuses a name in use), so that
    # Ctrl-C at any moment after the file is created finds its name here to remove: tempfile.mkstemp
    # hands the name back only after creating the file, and Ctrl-C in between left it behind.
    tmp = os.path.join(directory, f".{os.path.basename(target)}.{os.urandom(8).hex()}{TMP_SUFFIX}")
    fd: int | None = None
    flusher: _EarlyWriteback | _NoFlush | None = None
    try:
        fd = os.open(tmp, _TEMP_FLAGS, 0o600)
        flusher = _EarlyWriteback(fd) if durable else _NoFlush(fd)
        yield tmp
        if hasattr(os, "fchmod"):  # private while written; then what any new file gets, or the replaced one's
            os.fchmod(fd, _final_mode(target, force))
        flusher.stop()
        if durable:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        if force:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise OutputError(f"{target}: appeared while writing; pass {force_hint} to replace it",
                                  exit_code=ExitCode.USAGE) from None
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                    raise
                if os.path.lexists(target):
                    raise OutputError(f"{target}: appeared while writing; pass {force_hint} to replace it",
                                      exit_code=ExitCode.USAGE) from None
                os.replace(tmp, target)
            else:
                os.unlink(tmp)
        if durable:
            _fsync_dir(directory)
    except OSError as exc:
        if fd is not None or not isinstance(exc, FileExistsError):  # never another run's file
            _discard(tmp, fd, flusher)
        if exc.errno == errno.ENOSPC:
            raise OutputError(f"{target}: no space left on device; nothing was written") from None
        raise OutputError(f"{target}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        _discard(tmp, fd, flusher)
        raise


def _final_mode(target: str, force: bool) -> int:
    """The permissions of a finished output: those of the file it replaces (``force``), as ``sed -i`` and
    rsync keep them; else what ``open()`` gives a new file, 0o666 less the umask (0o644 under the usual
    022), so that an output is as readable as one ``cp`` or ``np.savez`` writes."""
    if force:
        try:
            st = os.stat(target)
        except OSError:
            pass
        else:
            if stat.S_ISREG(st.st_mode):
                return stat.S_IMODE(st.st_mode)
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (a thread creating a file
    meanwhile would get the wrong mode); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# tempfile.mkstemp's flags: a new file only, not through a symbolic link, not inherited by children
_TEMP_FLAGS = (os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def _discard(tmp: str, fd: int | None, flusher: _EarlyWriteback | _NoFlush | None) -> None:
    """Remove a failed or interrupted run's temporary file, first: a second Ctrl-C while the flushing
    thread is joined (a flush of a large file can take a second) must not leave it behind. Then stop
    the thread and close the descriptor."""
    _remove(tmp)
    if flusher is not None:
        flusher.stop()
    elif fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
    _remove(tmp)  # where an open file cannot be removed (Windows), once it is closed


# The output file's buffer: writes smaller than it (small tensors: a 20,000-tensor dump's average 12 KB) are
# gathered into fewer system calls (clip of such a dump 7 % faster); larger ones (every piece of a big
# tensor, io.base.WRITE_PIECE) go straight to the file without a copy into it, as with the default buffer
OUTPUT_BUFFER = 64 << 10


def open_output(path: str) -> BinaryIO:
    """``open(path, "wb")`` for a writer, without truncating the empty temporary file that
    :func:`atomic_output` created. On ext4 (``auto_da_alloc``, the default) truncating a file marks it,
    and the file's next close flushes it to disk: 0.2 s per 500 MB, which the durable path does anyway with
    fsync and which ``--no-fsync`` asked not to pay. A file that is not empty is truncated as usual."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)
    try:
        if os.fstat(fd).st_size:
            os.ftruncate(fd, 0)
        return os.fdopen(fd, "wb", buffering=OUTPUT_BUFFER)
    except BaseException:
        os.close(fd)
        raise


# Outputs smaller than this are written without reserving their space first (the reservation's first call
# costs ~1.3 ms, importing ctypes; a small file's blocks are reserved in a few writes anyway)
PREALLOCATE_MIN = 16 << 20


def preallocate(fd: int, start: int, nbytes: int) -> bool:
    """Reserve the disk blocks of bytes [start, start + nbytes) of the open file ``fd`` before writing
    them, by Linux's ``fallocate(2)`` with FALLOC_FL_KEEP_SIZE: the file's size stays as it is (it grows
    as writes reach it, so a reservation never reads as zeros), and ext4 then takes the written pages
    without reserving blocks for each: 500 MB written in 256 KiB pieces into a new file 0.103 -> 0.070 s,
    copied by ``copy_file_range`` 0.12 -> 0.089 s, the same written and fsynced 0.30 -> 0.27 s (6.18
    kernel, AMD EPYC VM). A full disk is also met before any byte is written. Blocks reserved past where
    the file ends stay allocated, so a caller reserves no more than it will write. Returns whether the
    blocks were reserved: not under PREALLOCATE_MIN bytes, and only on :data:`PREALLOCATING_FILESYSTEMS`
    where the call exists and is not refused; the others write as before.
    glibc's ``posix_fallocate`` (``os.posix_fallocate``) is not used: where the filesystem refuses, it
    writes a zero into every block, and it sets the file's size."""
    if nbytes < PREALLOCATE_MIN or filesystem_of(fd) not in PREALLOCATING_FILESYSTEMS:
        return False
    call = _fallocate()
    if call is None:
        return False
    return call(fd, _FALLOC_FL_KEEP_SIZE, start, nbytes) == 0


# Filesystems where reserving an output's blocks was measured to pay (above). Not tmpfs, where a reserved
# page is a zeroed page of memory before it is written: 500 MB 0.167 -> 0.183 s; not the others, unmeasured
# (XFS and btrfs allocate late and in large extents by themselves; ZFS and NFS before 4.2 refuse the call)
PREALLOCATING_FILESYSTEMS = frozenset({"ext4"})
_FALLOC_FL_KEEP_SIZE = 1  # linux/falloc.h
_fallocate_call: list[Any] = []


def _fallocate() -> Any:
    """libc's ``fallocate64`` (64-bit offsets everywhere), found once; None off Linux."""
    if not _fallocate_call:
        call = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                call = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
                if call is not None:
                    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
                    call.restype = ctypes.c_int
            except (ImportError, OSError):
                call = None
        _fallocate_call.append(call)
    return _fallocate_call[0]


_filesystem_of_device: dict[int, str | None] = {}


def filesystem_of(fd: int) -> str | None:
    """The type of the filesystem the open file ``fd`` is on ("ext4", "tmpfs", "xfs", ...), found by its
    device in ``/proc/self/mountinfo`` (each device read once a process); None where that cannot be told
    (not Linux; a device not listed there, as a btrfs subvolume's)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        device = os.fstat(fd).st_dev
    except OSError:
        return None
    if device not in _filesystem_of_device:
        _filesystem_of_device[device] = _mounted_filesystem(device)
    return _filesystem_of_device[device]


def _mounted_filesystem(device: int, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem mounted from ``device`` (an ``st_dev``), from ``mountinfo`` (each line:
    id, parent id, major:minor, root, mount point, options, optional fields, "-", type, source, options);
    None where not found."""
    wanted = f"{os.major(device)}:{os.minor(device)}"
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == wanted and "-" in fields[3:]:
                    rest = fields[fields.index("-", 3) + 1:]
                    return rest[0] if rest else None
    except OSError:
        pass
    return None


def settle_truncation(path: str) -> None:
    """For a file that a library created with O_TRUNC over the empty temporary file (h5py's mode "w"):
    ext4's mark (see :func:`open_output`) is consumed by the next close of any descriptor of the file, so
    one open-and-close now, while the file is still nearly empty, costs nothing, instead of a flush of the
    whole output at the writer's close. Elsewhere it is one harmless open and close."""
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError:
        pass


class _EarlyWriteback:
    """Starts writeback of the temporary file while it is still being written (a background
    ``fdatasync`` every ``PERIOD`` seconds), so the final fsync, which atomicity needs, finds little left
    to do. The thread only flushes; it never writes.

    PERIOD, measured with a durable in-process clip of the 500 MB dumps (8 alternations): 0.25 s left
    most of the writeback to the final fsync (safetensors 0.84 s, npz 0.89, HDF5 0.91); 10 ms overlaps
    it with the writing (0.67, 0.74, 0.76 s: every pair faster). 5 ms and 20 ms were within a few
    percent of 10; 50 and 100 ms slower. A flush of a file with nothing new to write costs little."""

    PERIOD = 0.01

    def __init__(self, fd: int):
        import threading

        self._fd = fd
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gradtool-writeback", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.PERIOD):
            try:
                os.fdatasync(self._fd)
            except OSError:
                return

    def stop(self) -> None:
        if not self._done.is_set():
            self._done.set()
            self._thread.join()
            try:
                os.close(self._fd)
            except OSError:
                pass


class _NoFlush:
    """The non-durable stand-in for :class:`_EarlyWriteback`: only closes the descriptor."""

    def __init__(self, fd: int):
        self._fd: int | None = fd

    def stop(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
