"""What every format shares: tensor index entries, the lazy reader interface, name and size checks."""

from __future__ import annotations

import contextlib
import errno
import math
import mmap
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from ..errors import InputError, UnsafeInputError
from .atomic import filesystem_of

MAX_NAME_LENGTH = 4096


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused meanwhile (and on again after, if it was on): an index or a log
    of many thousands of small objects that hold no cycles is built without the collector's repeated
    scans of them, which cost more than building them (a 20,000-tensor safetensors header: 0.22 -> 0.16
    s; a 10^6-line log, more than its parse)."""
    import gc

    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class DeferredDtype:
    """An ml_dtypes dtype (``bfloat16``, ``float8_e4m3fn``, ``float8_e5m2``) known by its name and size
    before ml_dtypes is imported: ``import ml_dtypes`` 0.7 takes ~0.5 s (6 ms in 0.6: it registers its
    new types' loops with NumPy one by one, each a search of the loops before it), which a ``stats`` of
    a bfloat16 dump read by the compiled kernel (its bits) does not need. It answers as the dtype: its
    ``name``, ``itemsize``, ``byteorder``, ``isnative`` and ``hasobject`` without the import; NumPy takes
    it wherever a dtype goes (``np.dtype(d)``, ``np.frombuffer(b, d)``, ``a.view(d)``: an object's
    ``dtype`` attribute), as ``==`` and ``hash`` do; any other attribute is the dtype's. All but those
    five import ml_dtypes (``==`` only against a dtype of the same name)."""

    __slots__ = ("name", "itemsize", "_dtype")
    byteorder, isnative, hasobject = "=", True, False  # (its kind is the dtype's: "V", float8_e5m2's "f")

    def __init__(self, name: str, itemsize: int) -> None:
        self.name, self.itemsize, self._dtype = name, itemsize, None

    @property
    def dtype(self) -> np.dtype:
        """NumPy's dtype (ml_dtypes imported here)."""
        if self._dtype is None:
            import ml_dtypes

            self._dtype = np.dtype(getattr(ml_dtypes, self.name))
        return self._dtype

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__") or attribute in DeferredDtype.__slots__:  # (copy and pickle's
            raise AttributeError(attribute)  # questions, and slots not yet set: not the dtype's)
        return getattr(self.dtype, attribute)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DeferredDtype):
            return self.name == other.name
        try:  # float32, np.float64, "f2": told apart by name, without the import
            name = (other if isinstance(other, np.dtype) else np.dtype(other)).name  # type: ignore[arg-type]
        except (TypeError, ValueError):  # (a name NumPy knows only once ml_dtypes is imported)
            name = self.name
        if name != self.name:
            return False
        try:
            return bool(self.dtype == other)
        except TypeError:
            return False

    def __hash__(self) -> int:
        return hash(self.dtype)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"dtype({self.name})"


_U16 = np.dtype(np.uint16)


def bits_view(info: TensorInfo) -> np.dtype | None:
    """uint16, the dtype a bfloat16 tensor's chunks are taken as where the compiled kernel reads them (its
    bits: ``stats``, ``clip`` by a norm), when its dtype is a :class:`DeferredDtype` (ml_dtypes, ~0.5 s
    to import in 0.7, not imported yet); None (the tensor's own dtype) for any other tensor."""
    d = info.dtype
    return _U16 if type(d) is DeferredDtype and d.name == "bfloat16" else None


@dataclass(slots=True, weakref_slot=True)
class TensorInfo:
    """One entry of a dump's index: what is known without reading the data."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    attrs: dict[str, Any] = field(default_factory=dict)  # HDF5 dataset attributes, kept on write
    compression: str | None = None  # "gzip"/"deflate" when the input stored it compressed
    compression_opts: Any = None
    fortran: bool = False  # stored in Fortran order (npy/npz): chunks come in storage order

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1 << 40


PAGE = mmap.PAGESIZE
ALIAS_BYTES = 64  # see buffer_phase


def buffer_phase(reads: Sequence[int] = (), writes: Sequence[int] = ()) -> int:
    """Where in a page a buffer should start (a multiple of 64) for the kernel's copies into it (pread
    from file offsets ``reads``) and out of it (write/pwrite to file offsets ``writes``) to run at full
    speed: the first phase at which no copy's destination lies 1 to ALIAS_BYTES-1 bytes after its source,
    modulo the page. On an AMD EPYC (Zen 3) such copies run at a third of the speed (pread 2.1 against
    7 GB/s, writing new pages 2.1x slower; measured at every phase: 1-31 bytes, ALIAS_BYTES leaves a margin
    for other CPUs), and malloc's placement of a buffer made it a matter of luck. The compiled kernel
    places its own buffer the same way (``_kernels.c``: phased)."""
    if len(reads) + len(writes) == 1:  # the common case, directly: the copy's destination 0-63 bytes *before*
        return (reads[0] & ~63) % PAGE if reads else (-(-writes[0] // 64) * 64) % PAGE  # its source
    for phase in range(0, PAGE, 64):
        if all(not 0 < (phase - a) % PAGE < ALIAS_BYTES for a in reads) and \
                all(not 0 < (b - phase) % PAGE < ALIAS_BYTES for b in writes):
            return phase
    return 0  # not reached for fewer than 64 offsets: each excludes at most one of the 64 phases


def pread_at(fd: int, offset: int) -> Callable[[memoryview, int], int]:
    """``read_into(view, pos)`` for :meth:`DumpReader._fill` and the chunk readers: ``pread`` of the
    bytes at ``offset + pos`` of ``fd`` into ``view``, returning how many it read."""
    return lambda view, pos: os.preadv(fd, [view], offset + pos)


def fill_view(view: memoryview, read_into: Callable[[memoryview, int], int], what: str) -> None:
    """Fill ``view`` by ``read_into(rest_of_view, position)`` calls, which return the bytes they read (0 at
    a premature end: a truncated file, "WHAT is truncated")."""
    pos = 0
    while pos < len(view):
        n = read_into(view[pos:], pos)
        if not n or n < 0:
            raise InputError(f"{what} is truncated")
        pos += n


def address(a: np.ndarray) -> int:
    """The address of an array's first byte (without importing ctypes, as ``a.ctypes.data`` does)."""
    return int(a.__array_interface__["data"][0])


class PhasedBuffer:
    """A reusable byte buffer handing out views that start at a chosen phase of a page (see
    :func:`buffer_phase`); ``2 * PAGE`` bytes of slack make room for any phase."""

    def __init__(self) -> None:
        self._base: np.ndarray | None = None
        self._page = 0  # where in the base the first page boundary is

    def get(self, nbytes: int, phase: int = 0) -> np.ndarray:
        """``nbytes`` bytes (uint8) starting ``phase`` bytes into a page; the previous view's contents are
        not kept when it grows."""
        if self._base is None or self._base.nbytes < nbytes + 2 * PAGE:
            self._base = np.empty(nbytes + 2 * PAGE, np.uint8)
            self._page = (-address(self._base)) % PAGE
        start = self._page + phase % PAGE
        return self._base[start: start + nbytes]


_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f]")  # one C scan, not a Python loop per character


_PLAIN_NAME = re.compile("[^\x00-\x1f\x7f/\\\\]+")  # no control character, no path separator


def check_tensor_name(name: Any, path: str) -> str:
    """Refuse names that could escape a directory or corrupt output: '..' parts, absolute paths, NUL and
    control characters, empty or absurdly long names. A name of one part (no / or \\) other than '.' and
    '..' is decided by one regular expression (a mixture of experts' dump has tens of thousands)."""
    if (type(name) is str and _PLAIN_NAME.fullmatch(name) and len(name) <= MAX_NAME_LENGTH
            and name not in (".", "..")):
        return name
    if not isinstance(name, str):
        raise UnsafeInputError(f"{path}: tensor name {name!r} is not a string")
    shown = name if len(name) <= 80 else name[:77] + "..."
    if not name:
        raise UnsafeInputError(f"{path}: empty tensor name")
    if len(name) > MAX_NAME_LENGTH:
        raise UnsafeInputError(f"{path}: tensor name of {len(name)} characters (more than {MAX_NAME_LENGTH})")
    if _CONTROL_CHARACTER.search(name):
        raise UnsafeInputError(f"{path}: tensor name {shown!r} contains control characters")
    if name.startswith(("/", "\\")) or (len(name) > 2 and name[0].isalpha() and name[1] == ":" and name[2] in "/\\"):
        raise UnsafeInputError(f"{path}: tensor name {shown!r} is an absolute path")
    parts = name.replace("\\", "/").split("/")
    if any(p in ("..", ".") for p in parts) or any(p == "" for p in parts):
        raise UnsafeInputError(f"{path}: tensor name {shown!r} has an empty, '.' or '..' path component")
    return name


def check_unique(names: Sequence[str], path: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise UnsafeInputError(f"{path}: duplicate tensor name {n!r}")
        seen.add(n)


def check_dtype(dtype: np.dtype, name: str, path: str) -> np.dtype:
    """Only plain numeric dtypes are tensors; object (pickle), string, void and structured dtypes are refused."""
    if dtype.hasobject:
        raise UnsafeInputError(f"{path}: tensor {name!r} holds Python objects (pickle); refusing to load it")
    from ..backend import is_floating_dtype

    if dtype.kind not in "biufc" and not is_floating_dtype(dtype):
        why = "not a numeric tensor"
        if dtype.kind == "V" and dtype.names is None and dtype.itemsize in (1, 2):  # np.save of ml_dtypes
            kind, size = ("bfloat16" if dtype.itemsize == 2 else "float8"), dtype.itemsize
            why = (f"raw {size}-byte values, as NumPy saves a {kind} array (JAX's, ml_dtypes'): the file "
                   "does not keep the type; save it as float32 (np.asarray(g, np.float32)) or with "
                   "safetensors.numpy.save_file, which keeps it")
        raise InputError(f"{path}: tensor {name!r} has unsupported dtype {dtype.str!r} ({why})")
    return dtype


def check_shape(shape: Any, name: str, path: str) -> tuple[int, ...]:
    """``shape`` as a tuple of ints: a tuple or list of at most 64 non-negative ints (not bools), else an
    InputError naming the tensor. (Plain ints, the usual case, are told by their types at C speed.)"""
    if not isinstance(shape, (tuple, list)):
        raise InputError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
    if not set(map(type, shape)) <= {int}:
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise InputError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
        shape = [int(d) for d in shape]
    if len(shape) > 64 or (shape and min(shape) < 0):
        raise InputError(f"{path}: tensor {name!r} has an invalid shape {tuple(shape)!r}")
    return tuple(shape)


PLACED_ALLOCATION_BYTES = 1 << 16  # from this size the 8 KiB of slack of a placed array are worth it


def allocate(info: TensorInfo, path: str, *, read_from: int | None = None) -> np.ndarray:
    """An empty array for a tensor, refusing sizes no machine here could hold (hostile headers).
    ``read_from``: the file offset the tensor's bytes will be read from in one go, to place the array
    where that copy runs at full speed (:func:`buffer_phase`; the array is then a view of a slightly
    larger buffer)."""
    if info.nbytes > physical_memory():
        raise UnsafeInputError(
            f"{path}: tensor {info.name!r} claims {info.nbytes} bytes, more than this machine's memory"
        )
    try:
        if read_from is None or info.nbytes < PLACED_ALLOCATION_BYTES:
            return np.empty(info.shape, dtype=info.dtype)
        raw = PhasedBuffer().get(info.nbytes, buffer_phase(reads=[read_from]))
        return raw.view(info.dtype).reshape(info.shape)
    except (MemoryError, ValueError) as exc:
        raise InputError(f"{path}: cannot allocate tensor {info.name!r} ({info.nbytes} bytes): {exc}") from None


MMAP_WINDOW_CHUNKS = 16  # 16 MiB windows of float32 at the default chunk size
PREAD_BELOW_BYTES = 256 << 10  # a smaller tensor is read with pread: a map and unmap cost ~21 us, more than
# reading (streaming a 4 KiB tensor 21 -> 7 us, 64 KiB 26 -> 10, 256 KiB 30 -> 18; 1 MiB: 30 against 48)


def metadata_step(metadata: dict[str, Any]) -> int | None:
    """A dump's ``step`` from its metadata when it is an integer (not a bool, string or float), else None."""
    s = metadata.get("step")
    return s if isinstance(s, int) and not isinstance(s, bool) else None


STEP_IN_NAME = re.compile(  # step_100, iter-100, it100; not in "split1" or "bf16"
    r"(?<![a-z])(?:global_?step|steps?|iter(?:ation)?s?|it|updates?|batch)[-_.=]?(\d+)", re.IGNORECASE)


def steps_of_names(names: Sequence[str]) -> list[int] | None:
    """The steps that ``names`` (an HDF5 file's top-level groups) are, when each is a step word and a
    number (``step_100``, ``iter-5``, ``global_step200``) and no step repeats; else None. Bare numbers
    are not steps here: ``0``, ``1``, ... are also the layers of an ``nn.Sequential``."""
    found = [STEP_IN_NAME.fullmatch(n) for n in names]
    if not names or not all(found):
        return None
    steps = [int(m.group(1)) for m in found if m]
    return steps if len(set(steps)) == len(steps) else None


_BARE_NUMBER = re.compile("[0-9]+")


def numbered_names(names: Sequence[str]) -> list[int] | None:
    """The numbers that ``names`` (an HDF5 file's top-level groups) are, when each is a bare decimal number
    (``100``, ``200``: ``f.create_group(str(step))``) and none repeats; else None. Steps only when the user
    says so (``--numbered-groups-are-steps``), as ``0``, ``1``, ... are an ``nn.Sequential``'s layers too."""
    if not names or not all(_BARE_NUMBER.fullmatch(n) for n in names):
        return None
    numbers = [int(n) for n in names]
    return numbers if len(set(numbers)) == len(numbers) else None


LOSS_KEYS, LR_KEYS = ("loss", "train_loss"), ("lr", "learning_rate")  # a dump's loss and lr in its metadata
# Names of top-level scalars read as a dump's metadata, not as tensors: its step, loss and learning rate
# (the keys gradtool reads) and the other usual scalars of a training step
METADATA_SCALARS = frozenset({"step", "global_step", "epoch", "grad_norm", *LOSS_KEYS, *LR_KEYS})


class DumpReader:
    """A lazily read dump. Subclasses fill ``tensors`` and ``metadata`` on open and implement ``_read``."""

    format: str = "?"

    def __init__(self, path: str, *, display_path: str | None = None):
        self.path = path
        self.display_path = display_path or path
        self.group: str | None = None
        self.tensors: list[TensorInfo] = []
        self.metadata: dict[str, Any] = {}
        self.metadata_members: list[TensorInfo] = []  # the scalars read as metadata (_scalars_as_metadata)
        self.group_attrs: dict[str, dict[str, Any]] = {}  # HDF5: group path (relative) -> attributes
        self.soft_links: dict[str, str] = {}  # HDF5: soft link path (relative) -> the path it names
        self.hard_links: dict[str, str] = {}  # HDF5: an object's second name -> its indexed name ("": root)

    # -- index
    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def info(self, name: str) -> TensorInfo:
        """The tensor named ``name`` (KeyError if none), by a dict built from ``tensors`` and built again
        when that list is replaced or grows. A scan of the list made ``clip`` quadratic in the tensor count:
        11 of its 12 s for a dump of 20,000 tensors, asked for each by name."""
        cached = self.__dict__.get("_info_index")
        if cached is None or cached[0] is not self.tensors or cached[1] != len(self.tensors):
            cached = self._info_index = (self.tensors, len(self.tensors), {t.name: t for t in self.tensors})
        try:
            return cached[2][name]
        except KeyError:
            raise KeyError(name) from None

    @property
    def step(self) -> int | None:
        return metadata_step(self.metadata)

    def metadata_outside_members(self) -> dict[str, Any]:
        """The metadata a copy of this dump stores as its format's metadata (``__metadata__.json``, HDF5
        attributes, safetensors ``__metadata__``): all of it but the scalars it holds as members
        (:attr:`metadata_members`), which a copy writes back as members, so that it reads as the input."""
        members = {t.name for t in self.metadata_members}
        return {k: v for k, v in self.metadata.items() if k not in members}

    # -- data
    def read(self, name: str) -> np.ndarray:
        """Load one tensor (a fresh array, never a view of the file)."""
        return self._read(self.info(name))

    def _read(self, info: TensorInfo) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def iter_chunks(self, info: TensorInfo, chunk_elements: int = 1 << 16) -> Iterator[np.ndarray]:
        """The tensor's elements as 1-D chunks in storage order, through a small reused buffer.

        Memory stays bounded by the chunk, whatever the tensor's size. A yielded chunk is only valid
        until the next one is requested. Formats that can read at an offset override this; the default
        reads the whole tensor and slices it.
        """
        flat = self._read(info).reshape(-1)
        for start in range(0, flat.shape[0], chunk_elements):
            yield flat[start: start + chunk_elements]

    def iter_chunks_ahead(self, info: TensorInfo, chunk_elements: int = 1 << 16) -> Iterator[np.ndarray]:
        """:meth:`iter_chunks`, with the next chunks produced by a worker thread while the caller works on
        this one where that pays (formats whose chunks cost CPU to produce, e.g. a deflated npz member:
        see :func:`read_ahead`); here, iter_chunks itself."""
        return self.iter_chunks(info, chunk_elements)

    def chunks_into(self, location: tuple[int, int], info: TensorInfo, buffer: np.ndarray,
                    chunk_elements: int, view_as: np.dtype | None = None) -> Iterator[np.ndarray]:
        """The chunks of a tensor at ``raw_location``, read by ``pread`` into ``buffer`` (uint8, at least
        one chunk long), as views of it that the caller may change in place before asking for the next
        (``clip`` scales them there and writes them out: one buffer, where a memory map needs a second to
        scale into); ``view_as``: the dtype of the views (an unsigned integer of the tensor's width: its
        bits), default the tensor's."""
        return self._buffered_chunks(info, chunk_elements, pread_at(*location), buffer, view_as=view_as)

    def raw_location(self, info: TensorInfo) -> tuple[int, int] | None:
        """(file descriptor, byte offset) when the tensor's bytes lie uncompressed, contiguous and in native
        byte order in one file, so that any element range can be read independently (and so by several
        threads at once, see :meth:`range_window`); None otherwise (compressed, chunked, sharded, stdin)."""
        return None

    def raw_segments(self, info: TensorInfo, *, crc_by_caller: bool = False
                     ) -> list[tuple[DumpReader, TensorInfo, tuple[int, int]]] | None:
        """The runs of bytes a tensor is made of, in element order, as (reader, piece, raw_location):
        one run here (none for an empty tensor); a sharded step's pieces in its shard files. None when a
        run cannot be read at an offset. ``crc_by_caller``: the caller reads every byte of each run and
        takes its CRC-32 on the way, so a reader whose format stores one leaves its check to the caller
        (see :meth:`crc_seed`) instead of reading the bytes a first time to make it here."""
        if info.size == 0:
            return []
        location = self.location_checked_by_caller(info) if crc_by_caller else self.raw_location(info)
        return None if location is None else [(self, info, location)]

    def location_checked_by_caller(self, info: TensorInfo) -> tuple[int, int] | None:
        """:meth:`raw_location` for a caller that checks the bytes' CRC-32 itself (:meth:`crc_seed`,
        :meth:`settle_crc`); the same here, where there is no stored checksum."""
        return self.raw_location(info)

    def crc_seed(self, info: TensorInfo) -> int | None:
        """After :meth:`location_checked_by_caller`: the CRC-32 to continue over the tensor's bytes at that
        location, in order (``zlib.crc32(data, seed)``), and to hand to :meth:`settle_crc` before anything
        computed from them is used; None when nothing is owed (no stored checksum, or the bytes were checked
        already). Raises InputError for bytes already found damaged."""
        return None

    def settle_crc(self, info: TensorInfo, crc: int) -> None:
        """The caller's CRC-32 of a tensor's bytes (continued from :meth:`crc_seed`), judged: InputError,
        naming the file and member, when it is not the stored one."""

    def range_window(self, location: tuple[int, int], info: TensorInfo, start: int, stop: int,
                     buffer: PhasedBuffer | None = None, copy: bool = False,
                     view_as: np.dtype | None = None) -> Iterator[np.ndarray]:
        """Yields once: elements [start, stop) of a tensor at ``raw_location`` as one 1-D array, a view of
        a read-only memory map when the data is aligned, else (or with ``copy``: for a few KiB one ``pread``
        costs less than a map; or where the file system cannot map files) read with ``pread`` into
        ``buffer`` (a new one if None), at the phase of a page where that read runs at full speed
        (:func:`buffer_phase`). The map is closed when the generator resumes. Touches no shared state, so
        threads may call it concurrently on one reader. ``view_as``: the array's dtype (of the tensor's
        width: its bits, see :func:`bits_view`), default the tensor's."""
        import mmap

        dtype = info.dtype if view_as is None else view_as
        fd, offset = location
        itemsize = info.dtype.itemsize
        byte_start = offset + start * itemsize
        nbytes = (stop - start) * itemsize
        if nbytes <= 0:
            return
        m = None
        base = byte_start - byte_start % mmap.ALLOCATIONGRANULARITY
        if not (copy or offset % itemsize):  # (unaligned data, np.savez's members, is read: NumPy is many
            # times slower on unaligned views)
            try:
                m = mmap.mmap(fd, byte_start - base + nbytes, access=mmap.ACCESS_READ, offset=base)
            except (OSError, ValueError):  # a file system that cannot map files: read them instead
                m = None
        if m is None:
            view = (buffer or PhasedBuffer()).get(nbytes, buffer_phase(reads=[byte_start]))
            self._fill(memoryview(view), pread_at(fd, byte_start), info)
            yield view.view(dtype)
            return
        try:
            m.madvise(mmap.MADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        window = np.frombuffer(m, dtype=dtype, count=stop - start, offset=byte_start - base)
        yield window
        del window
        try:
            m.close()
        except BufferError:  # the caller kept a view: the map is released when that goes
            pass

    def _fill(self, view: memoryview, read_into: Any, info: TensorInfo) -> None:
        """:func:`fill_view` naming this file and the tensor when it ends early."""
        fill_view(view, read_into, f"{self.display_path}: tensor {info.name!r}")

    def _read_at(self, fd: int, offset: int, info: TensorInfo, shape: tuple[int, ...]) -> np.ndarray:
        """A new array of ``shape`` filled by ``pread`` from ``offset`` of ``fd``, placed where that copy runs
        at full speed (:func:`allocate`)."""
        out = allocate(TensorInfo(info.name, shape, info.dtype), self.display_path, read_from=offset)
        self._fill(memoryview(out.reshape(-1).view(np.uint8)), pread_at(fd, offset), info)
        return out

    def _checked_location(self, fd: int, offset: int, info: TensorInfo) -> tuple[int, int] | None:
        """(fd, offset) of a tensor's raw bytes, or None for a dtype read otherwise; InputError where the
        file (its size taken once a descriptor: an fstat a tensor cost ~1 us each, 20,000 a step) ends
        before them. A file cut short later is caught by the read (:func:`fill_view`)."""
        if not (info.dtype.isnative or info.dtype.itemsize == 1) or info.dtype.hasobject:
            return None
        sizes = self.__dict__.setdefault("_file_sizes", {})
        size = sizes.get(fd)
        if size is None:
            size = sizes[fd] = os.fstat(fd).st_size
        if offset + info.size * info.dtype.itemsize > size:
            raise InputError(f"{self.display_path}: tensor {info.name!r} is truncated")
        return fd, offset

    def _buffer(self, nbytes: int, phase: int = 0) -> np.ndarray:
        """The reader's reused read buffer of this thread (threads may read tensors of one reader at once:
        :func:`~gradtool.summarize._summarize_compressed`): ``nbytes`` (uint8, 64-byte aligned) at ``phase``
        in a page."""
        local = self.__dict__.get("_chunk_buffers")
        if local is None:
            local = self.__dict__.setdefault("_chunk_buffers", threading.local())
        buffers = getattr(local, "buffer", None)
        if buffers is None:
            buffers = local.buffer = PhasedBuffer()
        return buffers.get(max(nbytes, 1 << 16), phase)

    def _pread_chunks(self, fd: int, offset: int, info: TensorInfo, chunk_elements: int) -> Iterator[np.ndarray]:
        """Chunks of contiguous, uncompressed data at a byte offset of ``fd``.

        Aligned data is memory-mapped a window at a time and used in place (no copy: 1.4x faster than
        pread into a buffer in the benchmark), unless the tensor is under PREAD_BELOW_BYTES; unaligned data
        (most np.savez members) is pread into an aligned buffer, since NumPy is many times slower on
        unaligned views. A read-ahead thread was tried and lost to thread hand-off costs; see
        benchmarks/README.md."""
        if info.size == 0:
            return
        if offset % info.dtype.itemsize == 0 and info.dtype.isnative and info.nbytes >= PREAD_BELOW_BYTES:
            yield from self._mmap_chunks(fd, offset, info, chunk_elements)
            return
        yield from self._buffered_chunks(info, chunk_elements, pread_at(fd, offset),
                                         phase=buffer_phase(reads=[offset]))

    def _mmap_chunks(self, fd: int, offset: int, info: TensorInfo, chunk_elements: int) -> Iterator[np.ndarray]:
        """Chunks as views of a read-only memory map, one window of MMAP_WINDOW_CHUNKS chunks at a time
        (so resident memory stays bounded by the window, not the tensor)."""
        total = info.size
        if offset + total * info.dtype.itemsize > os.fstat(fd).st_size:
            raise InputError(f"{self.display_path}: tensor {info.name!r} is truncated")
        per_window = chunk_elements * MMAP_WINDOW_CHUNKS
        for wstart in range(0, total, per_window):
            for window in self.range_window((fd, offset), info, wstart, min(wstart + per_window, total)):
                for s in range(0, window.shape[0], chunk_elements):
                    yield window[s: s + chunk_elements]
                del window

    def _stream_chunks(self, f: Any, info: TensorInfo, chunk_elements: int) -> Iterator[np.ndarray]:
        """Chunks read sequentially from a file-like object (e.g. a compressed zip member)."""
        return self._buffered_chunks(info, chunk_elements, lambda view, pos: f.readinto(view))

    def _buffered_chunks(self, info: TensorInfo, chunk_elements: int, read_into: Any,
                         buffer: np.ndarray | None = None, phase: int = 0,
                         view_as: np.dtype | None = None) -> Iterator[np.ndarray]:
        """Chunks filled into ``buffer`` (8-byte aligned uint8), else the reader's reused aligned buffer
        (starting ``phase`` bytes into a page: see :func:`buffer_phase`), by ``read_into(view,
        byte_position)``, which returns the number of bytes it read (0 at a premature end: a truncated
        file); as ``view_as`` (a dtype of the tensor's width: its bits) when given."""
        itemsize = info.dtype.itemsize
        native = info.dtype.isnative or itemsize == 1
        as_dtype = info.dtype if view_as is None else view_as if native else view_as.newbyteorder(
            info.dtype.byteorder)
        total = info.size
        nbytes = min(total, chunk_elements) * itemsize
        if buffer is None:
            buf = self._buffer(nbytes, phase)
        else:  # the caller's (its thread's): too small, a new one rather than the reader's shared buffer
            buf = buffer if buffer.nbytes >= nbytes else np.empty(nbytes // 8 + 1, np.float64).view(np.uint8)
        for start in range(0, total, chunk_elements):
            count = min(chunk_elements, total - start)
            self._fill(memoryview(buf)[: count * itemsize],
                       lambda view, pos, at=start * itemsize: read_into(view, at + pos), info)
            chunk = buf[: count * itemsize].view(as_dtype)
            yield chunk if native else chunk.astype(as_dtype.newbyteorder("="))

    def iter_tensors(self, names: Sequence[str] | None = None) -> Iterator[tuple[TensorInfo, np.ndarray]]:
        wanted = None if names is None else set(names)
        for info in self.tensors:
            if wanted is None or info.name in wanted:
                yield info, self._read(info)

    def close(self) -> None:
        pass

    def __enter__(self) -> DumpReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _validate_index(self) -> None:
        """Refuse path-like, control-character and duplicate tensor names, then take the metadata scalars
        out of the tensors (:meth:`_scalars_as_metadata`); a refused file is closed first, so a reader that
        refuses a file leaves no descriptor open."""
        try:
            for t in self.tensors:
                check_tensor_name(t.name, self.display_path)
            check_unique(self.names, self.display_path)
            self._scalars_as_metadata()
        except BaseException:
            self.close()
            raise

    def _scalars_as_metadata(self) -> None:
        """Top-level scalars (0-d, integer or floating) named as training metadata (:data:`METADATA_SCALARS`)
        are the dump's metadata, not tensors: ``np.savez(path, **grads, step=step, loss=loss, lr=lr)``. As
        tensors the loss entered the global norm as if it were a gradient, and ``clip`` scaled it. A name
        the dump's metadata holds already stays a tensor."""
        from ..backend import is_floating_dtype

        found = [t for t in self.tensors if t.name in METADATA_SCALARS and t.shape == () and t.name not in
                 self.metadata and (t.dtype.kind in "iu" or is_floating_dtype(t.dtype))]
        for t in found:
            value = self._read(t).reshape(())[()]
            self.metadata[t.name] = int(value) if t.dtype.kind in "iu" else float(value)
        if found:
            self.tensors = [t for t in self.tensors if t not in found]
            self.metadata_members = found


READ_AHEAD = 3  # chunks a read-ahead thread may hold (each the size of the first chunk)


def read_ahead(chunks: Iterator[np.ndarray], depth: int = READ_AHEAD) -> Iterator[np.ndarray]:
    """The chunks of ``chunks`` (which may reuse one buffer), produced on a worker thread up to ``depth``
    chunks ahead of the caller and copied into ``depth`` rotating arrays: a yielded chunk is valid until
    the next is requested, as from ``chunks`` itself. Pays where producing a chunk costs CPU and releases
    the GIL (inflating: ~1 ms a 256 KiB chunk, against ~30 µs for the copy and the hand-off); for chunks
    read from the page cache the hand-offs cost more than they save (measured). An exception raised by
    ``chunks`` is raised here; when the caller stops early, the worker stops and ``chunks`` is closed."""
    import queue

    ready: queue.Queue = queue.Queue()
    free: queue.Queue = queue.Queue()
    stop = threading.Event()
    done = object()

    def produce() -> None:
        made: list[np.ndarray] = []
        try:
            for c in chunks:
                if stop.is_set():
                    return
                if len(made) < depth:
                    made.append(np.empty_like(c))
                    slot = made[-1]
                else:
                    slot = free.get()
                    if slot is None:  # the caller stopped
                        return
                if slot.shape[0] < c.shape[0]:
                    slot = np.empty_like(c)
                np.copyto(slot[: c.shape[0]], c)
                ready.put((slot, c.shape[0]))
            ready.put(done)
        except BaseException as exc:  # handed to the caller, raised there
            ready.put(exc)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=produce, name="gradtool-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            item = ready.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            slot, n = item
            yield slot[:n]
            free.put(slot)
    finally:
        stop.set()
        free.put(None)
        worker.join()


class WorkAhead:
    """Chunks of bytes read (``pread``) and worked on in place (``clip``'s scaling) on a worker thread, up
    to ``depth`` chunks ahead of the caller, who writes each out before asking for the next: the write (the
    kernel's copy into new page-cache pages, the slowest step) runs beside the next chunks' reads and work
    instead of after them. ``clip --mode global-norm`` of the 500 MB GPT-2 set: its read, scale and write
    0.09 -> 0.065 s (read and work ~0.04 s, the write ~0.06); a read-and-write copy of it 0.097 -> 0.065 s.
    Where the chunks go to a fast consumer, the hand-offs (two a chunk, ~10 us each) cost more than they
    save: for chunks read to be measured only (see :func:`read_ahead`), and for a single chunk (callers
    take those serially). The slots (one :class:`PhasedBuffer` each, a chunk long) are made on first use
    and kept from call to call; one instance serves one thread of callers, the worker thread the whole
    process."""

    def __init__(self, depth: int = READ_AHEAD) -> None:
        self._depth = depth
        self._buffers: list[PhasedBuffer] = []  # made on first use
        self._alone: PhasedBuffer | None = None  # while the worker serves another

    def chunks(self, fill: Callable[[memoryview, int], None], nbytes: int, chunk_bytes: int, phase: int,
               work: Callable[[np.ndarray], Any] | None = None) -> Iterator[tuple[np.ndarray, Any]]:
        """``(chunk, work(chunk))`` (``work`` None: ``(chunk, None)``) for each ``chunk_bytes`` of
        ``nbytes`` in order, ``chunk`` (uint8) filled by ``fill(view, at)`` with the bytes from ``at`` on
        (which raises at a premature end), in a slot starting ``phase`` bytes into a page
        (:func:`buffer_phase`), valid until the next is asked for. A ``fill`` or ``work`` error is raised
        here; when the caller stops early the worker stops, and it has let go of the slots before this
        generator closes. While the worker serves another caller (a second thread, or a second of these
        generators open at once), the chunks are read and worked on here."""
        import queue

        self._buffers = self._buffers or [PhasedBuffer() for _ in range(self._depth)]
        slots = [b.get(min(nbytes, chunk_bytes), phase) for b in self._buffers]
        starts = range(0, nbytes, chunk_bytes)

        def filled(slot: np.ndarray, start: int) -> np.ndarray:
            view = slot[: min(chunk_bytes, nbytes - start)]
            fill(memoryview(view), start)
            return view

        if not _WORK_AHEAD_FREE.acquire(blocking=False):
            self._alone = self._alone or PhasedBuffer()
            alone = self._alone.get(len(slots[0]), phase)
            for start in starts:
                chunk = filled(alone, start)
                yield chunk, None if work is None else work(chunk)
            return
        ready: queue.SimpleQueue = queue.SimpleQueue()
        free: queue.SimpleQueue = queue.SimpleQueue()
        for slot in slots:
            free.put(slot)
        stopped = False

        def produce() -> None:
            try:
                for start in starts:
                    slot = free.get()
                    if stopped:
                        return
                    chunk = filled(slot, start)
                    ready.put((slot, chunk, None if work is None else work(chunk)))
            except BaseException as exc:  # handed to the caller, raised there
                ready.put(exc)

        try:
            job = _work_ahead_thread().submit(produce)
        except BaseException:
            _WORK_AHEAD_FREE.release()
            raise
        try:
            for _ in starts:
                item = ready.get()
                if isinstance(item, BaseException):
                    raise item
                slot, chunk, result = item
                yield chunk, result
                free.put(slot)
        finally:
            stopped = True
            free.put(slots[0])  # wakes a worker waiting for a slot, to see ``stopped``
            try:
                job.result()
            finally:
                _WORK_AHEAD_FREE.release()


_WORK_AHEAD_FREE = threading.Lock()  # held while a WorkAhead generator has the worker


def kept_thread_pool(name: str, workers: int = 1) -> Any:
    """The ``ThreadPoolExecutor`` of ``workers`` threads named ``name`` (made on first use, kept for the
    process): :class:`WorkAhead`'s worker, ``clip``'s inflater of the next run."""
    pool = _KEPT_POOLS.get(name)
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor

        with _KEPT_POOLS_LOCK:  # (two threads asking first: one pool)
            pool = _KEPT_POOLS.get(name) or ThreadPoolExecutor(workers, thread_name_prefix=name)
            _KEPT_POOLS[name] = pool
    return pool


_KEPT_POOLS: dict[str, Any] = {}
_KEPT_POOLS_LOCK = threading.Lock()


def _work_ahead_thread() -> Any:
    """:class:`WorkAhead`'s one worker thread."""
    return kept_thread_pool("gradtool-work-ahead")


def copy_range(source: tuple[int, int], dest_fd: int, dest_offset: int, nbytes: int, what: str) -> None:
    """Copy ``nbytes`` from ``source`` = (fd, offset) to ``dest_fd`` at ``dest_offset`` with
    ``os.copy_file_range``: the kernel copies page-cache pages (or shares extents on a filesystem with
    reflinks), with no trip through user space. Neither descriptor's file position moves. Where the call
    is missing or refused (another filesystem, an old kernel, a special file), the rest is copied with
    ``pread``/``pwrite`` through buffers placed by :func:`buffer_phase` (1 MiB chunks read on a worker
    thread while one is written: :class:`WorkAhead`), and so is a range of a page or more on a filesystem
    where that loop is the faster (:func:`kernel_copy_pays`: ext4, tmpfs), or whose source and destination
    lie at different points of a page: no filesystem can share such extents, and the kernel copies a
    range whose destination lies 1-31 bytes after its source
    (modulo the page) at 0.6 of the speed (400 MB: 0.33 s against 0.19 s in phase, 0.20 s 100 bytes
    apart), where this loop takes 0.19 s whatever the phases. Writers put their data in phase with the
    input's where they can (see :meth:`DumpWriter.plan`). ``what`` ("FILE: tensor 'NAME'") starts the
    one-line error raised when the source ends early (a file truncated since it was opened)."""
    fd, offset = source
    done = 0
    copy = getattr(os, "copy_file_range", None)
    if (offset - dest_offset) % PAGE and nbytes >= PAGE:
        copy = None  # out of phase: the kernel's copy is slower than ours (see above)
    elif copy is not None and nbytes >= PAGE and not kernel_copy_pays(dest_fd):
        copy = None  # a filesystem where the kernel copies as this loop does, only slower (see there)
    while copy is not None and done < nbytes:
        try:
            n = copy(fd, dest_fd, nbytes - done, offset + done, dest_offset + done)
        except OSError as exc:
            if exc.errno not in _NO_COPY_FILE_RANGE:
                raise
            break
        if n == 0:
            raise InputError(f"{what} is truncated")
        done += n
    if done == nbytes:
        return
    first = done

    def fill(view: memoryview, at: int) -> None:
        fill_view(view, pread_at(fd, offset + first + at), what)

    # the buffers in a page where neither the read into them nor the write out of them is slow
    phase = buffer_phase(reads=[offset + done], writes=[dest_offset + done])
    if nbytes - done > COPY_CHUNK:  # the next chunks read on a worker thread while one is written
        chunks: Iterator[tuple[np.ndarray, Any]] = _copy_ahead().chunks(fill, nbytes - done, COPY_CHUNK,
                                                                         phase)
    else:
        buf = PhasedBuffer().get(nbytes - done, phase)
        fill(memoryview(buf), 0)
        chunks = iter([(buf, None)])
    for chunk, _ in chunks:
        pwrite_all(dest_fd, memoryview(chunk), dest_offset + done)
        done += len(chunk)


COPY_CHUNK = 1 << 20  # copy_range's reads when it copies through user space (256 KiB: 0.076 s per 500 MB)
_COPY_AHEAD = threading.local()


def _copy_ahead() -> WorkAhead:
    """This thread's :class:`WorkAhead` for copy_range (its slots kept for the next copy)."""
    ahead = getattr(_COPY_AHEAD, "ahead", None)
    if ahead is None:
        ahead = _COPY_AHEAD.ahead = WorkAhead()
    return ahead


# Filesystems on which copy_file_range copies the pages as a read and a write would (no shared extents,
# no copy on a server) and the loop of copy_range is the faster: 500 MB in one call 0.089 s against 0.070
# on ext4 with the output's blocks reserved (atomic.preallocate), 0.166 against 0.158 on tmpfs (not
# reserved there); ``clip`` of the 500 MB GPT-2 set with nothing to clip 0.37 -> 0.33 s. Elsewhere (XFS,
# btrfs, bcachefs and ZFS share extents; NFS and SMB copy on the server) the kernel's copy is kept.
PAGE_COPYING_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "tmpfs"})


def kernel_copy_pays(fd: int) -> bool:
    """Whether ``copy_file_range`` into the file ``fd`` can do better than a read-and-write loop: False
    on :data:`PAGE_COPYING_FILESYSTEMS` (:func:`~.atomic.filesystem_of`); True elsewhere, and where the
    filesystem cannot be told."""
    return filesystem_of(fd) not in PAGE_COPYING_FILESYSTEMS


# Bytes handed to the kernel per write. A buffered write of 1 MiB or more into new page-cache pages of an
# ext4 file took 0.7-2.7 s per 2 GB on a 6.18 kernel (AMD EPYC VM), 256 KiB pieces of the same bytes a
# steady 0.36-0.58 s (64 KiB: 0.45 s): clip of a 2 GB dump, --no-fsync, 0.87-2.39 s (median 1.2) against
# 0.95-0.97 s in 256 KiB pieces. Smaller pieces cost a system call each (~1 us per 256 KiB).
WRITE_PIECE = 1 << 18


def write_all(f: BinaryIO, data: memoryview) -> None:
    """``f.write(data)`` (``data``: bytes, or a memoryview of them) in pieces of at most WRITE_PIECE bytes."""
    if len(data) <= WRITE_PIECE:
        f.write(data)
        return
    view = memoryview(data).cast("B")
    for start in range(0, len(view), WRITE_PIECE):
        f.write(view[start: start + WRITE_PIECE])


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """``os.pwrite`` until every byte of ``data`` is written at ``offset`` (a write may take fewer), at
    most WRITE_PIECE bytes a call."""
    while data:
        n = os.pwrite(fd, data[:WRITE_PIECE], offset)
        data, offset = data[n:], offset + n


# copy_file_range refused: not implemented (ENOSYS), across filesystems (EXDEV), not for these files
# (EINVAL, EOPNOTSUPP/ENOTSUP, EBADF on some special files), or by a sandbox's filter (EPERM)
_NO_COPY_FILE_RANGE = frozenset(getattr(errno, name) for name in
                                ("ENOSYS", "EXDEV", "EINVAL", "EOPNOTSUPP", "ENOTSUP", "EPERM", "EBADF")
                                if hasattr(errno, name))


class DumpWriter:
    """Writes one dump (or, for HDF5, several step groups) to an already chosen temporary path."""

    format: str = "?"
    # Where in the output file the bytes of the tensor being written by add_chunks start, set before it
    # takes the first chunk (a chunk producer may place its buffer by it: see buffer_phase); None where
    # unknown or not written as they are (compressed). npz data starts at a multiple of 64 bytes, which
    # any 64-byte aligned buffer is safe against.
    data_offset: int | None = None

    def __init__(self, path: str, metadata: dict[str, Any] | None = None):
        self.path = path
        self.metadata = dict(metadata or {})

    def plan(self, infos: list[TensorInfo], *, data_phase: int | None = None) -> None:
        """Announce the tensors (in order) that ``add`` will write; formats with a header need this.
        ``data_phase``: where in a memory page (offset modulo :data:`PAGE`) the input's first tensor
        starts, for a writer that copies unchanged tensors (:meth:`add_copy`) to place its data at the same
        point of a page: ranges in phase go to ``copy_file_range`` (which can share extents on a filesystem
        with reflinks), the others through user space (see :func:`copy_range`)."""

    def add(self, info: TensorInfo, array: np.ndarray) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def add_chunks(self, info: TensorInfo, chunks: Iterator[np.ndarray]) -> None:
        """Write a tensor given as 1-D C-order chunks (each consumed before the next is asked for).
        Formats that can stream override this; the default assembles the tensor first."""
        out = np.empty(info.shape, dtype=info.dtype)
        flat = out.reshape(-1)
        pos = 0
        for c in chunks:
            flat[pos: pos + c.shape[0]] = c
            pos += c.shape[0]
        self.add(info, out)

    def add_run(self, infos: list[TensorInfo], data: np.ndarray) -> None:
        """Write the tensors ``infos`` (next to one another in the plan) whose bytes, C-ordered and in native
        byte order, lie one after another in ``data`` (uint8): each through :meth:`add_chunks` here; a
        format that stores tensors back to back writes the bytes at once (``clip`` of many small tensors
        gives them so: see ``clip_dump._clip_run``)."""
        pos = 0
        for info in infos:
            self.add_chunks(info, iter([data[pos:pos + info.nbytes].view(info.dtype)]))
            pos += info.nbytes

    def add_copy(self, info: TensorInfo, source: tuple[int, int], where: str) -> bool:
        """Write a tensor whose bytes are to be copied unchanged from ``source`` = (file descriptor, byte
        offset), where they lie uncompressed, C-ordered and in native byte order (a reader's
        :meth:`DumpReader.raw_location`); ``where`` ("FILE: tensor 'NAME'") starts an error's message.
        Formats that store a tensor as those raw bytes copy them inside the kernel (:func:`copy_range`) and
        return True; the others return False, having written nothing, and the caller streams the tensor
        through :meth:`add_chunks` instead."""
        return False

    def set_group_attrs(self, group: str, attrs: dict[str, Any]) -> None:
        """Attributes of a (sub)group; only HDF5 keeps them."""

    def add_soft_link(self, name: str, target: str) -> None:
        """A soft link ``name`` (relative to the dump's root) to the path ``target``; only HDF5 keeps them."""

    def add_hard_link(self, name: str, existing: str) -> None:
        """A second name for the written object ``existing`` ("" for the root); only HDF5 keeps them."""

    def begin_step(self, group: str, metadata: dict[str, Any]) -> None:
        raise InputError(f"{self.path}: the {self.format} format holds one step per file")

    def close(self) -> None:
        pass

    def __enter__(self) -> DumpWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
