"""safetensors files, through a small header parser rather than the ``safetensors`` package.

Why our own: the format is 8 bytes of header length, a JSON header and raw little-endian data, so a
parser is ~100 lines; it lets us validate every offset before reading (out-of-range or overlapping
offsets are refused), read one tensor at a time with ``pread`` (the package's ``load_file`` holds the
whole file, twice), keep BF16/F8 via ml_dtypes, and avoid a compiled dependency. Interoperability with
the official package is tested both ways.

Layout: ``u64 N`` | N bytes of JSON ``{"name": {"dtype", "shape", "data_offsets": [b, e]}, ...,
"__metadata__": {str: str}}`` | data. gradtool stores its metadata values as JSON text in
``__metadata__`` (``{"step": "100", "loss": "0.25"}``). Tensor order = order of their data in the file.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

import numpy as np

from ..errors import InputError, UnsafeInputError
from .atomic import open_output, preallocate
from .base import (PAGE, DeferredDtype, DumpReader, DumpWriter, TensorInfo, check_shape, copy_range,
                   write_all)

MAX_HEADER = 100 * 1024 * 1024

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
CODES = {v: k for k, v in DTYPES.items()}
# ml_dtypes' types, by name: imported only when a file or an array has one (6 ms of every start-up else)
ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
ML_ITEMSIZES = {"BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
_DEFERRED: dict[str, DeferredDtype] = {}


def dtype_of(code: str) -> np.dtype | None:
    """The NumPy dtype of a safetensors dtype code (BF16 and F8 through ml_dtypes: a
    :class:`DeferredDtype` until ml_dtypes is imported); None if unknown."""
    if code in DTYPES:
        return DTYPES[code]
    if code not in ML_DTYPES:
        return None
    if "ml_dtypes" not in sys.modules:  # (one a code, shared by every tensor of it, as NumPy's dtypes are)
        if code not in _DEFERRED:
            _DEFERRED[code] = DeferredDtype(ML_DTYPES[code], ML_ITEMSIZES[code])
        return _DEFERRED[code]  # type: ignore[return-value]
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, ML_DTYPES[code]))


def code_of(dtype: np.dtype) -> str | None:
    """The safetensors code of a (little-endian) NumPy dtype; None if the format has none."""
    if isinstance(dtype, DeferredDtype):
        return next(code for code, name in ML_DTYPES.items() if name == dtype.name)
    if dtype in CODES:
        return CODES[dtype]
    for code, name in ML_DTYPES.items():  # an ml_dtypes array exists: ml_dtypes is imported already
        if dtype.name == name and dtype_of(code) == dtype:
            return code
    return None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict; ValueError naming the first key given twice (the dict made at C
    speed, the pairs searched only when it has fewer keys than they)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"duplicate key {k!r}")
            seen.add(k)
    return out


def _metadata_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


_ENTRY_KEYS = frozenset(("dtype", "shape", "data_offsets"))


class SafetensorsReader(DumpReader):
    format = "safetensors"

    def __init__(self, path: str, *, display_path: str | None = None):
        super().__init__(path, display_path=display_path)
        self._fd = os.open(path, os.O_RDONLY)
        try:
            self._index()
        except BaseException:
            os.close(self._fd)
            raise
        self._validate_index()

    def _index(self) -> None:
        p = self.display_path
        file_size = os.fstat(self._fd).st_size
        head = os.pread(self._fd, 8, 0)
        if len(head) < 8:
            raise InputError(f"{p}: not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise UnsafeInputError(f"{p}: safetensors header claims {n} bytes (limit {MAX_HEADER})")
        if 8 + n > file_size:
            raise InputError(f"{p}: truncated safetensors file (header of {n} bytes, file of {file_size})")
        raw = os.pread(self._fd, n, 8)
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise InputError(f"{p}: malformed safetensors header ({exc})") from None
        if not isinstance(header, dict):
            raise InputError(f"{p}: malformed safetensors header (not a JSON object)")
        self._data_start = 8 + n
        data_size = file_size - self._data_start
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict):
            raise InputError(f"{p}: safetensors __metadata__ is not an object")
        self.metadata = {str(k): _metadata_value(v) if isinstance(v, str) else v for k, v in meta.items()}
        entries = []
        for name, spec in header.items():
            if not isinstance(spec, dict) or not _ENTRY_KEYS <= spec.keys():
                raise InputError(f"{p}: tensor {name!r}: malformed header entry")
            code = spec["dtype"]
            dtype = dtype_of(code) if isinstance(code, str) else None
            if dtype is None:
                raise InputError(f"{p}: tensor {name!r}: unsupported dtype {code!r}")
            shape = check_shape(spec["shape"], name, p)
            offs = spec["data_offsets"]
            if (not isinstance(offs, list) or len(offs) != 2
                    or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
                raise InputError(f"{p}: tensor {name!r}: malformed data_offsets {offs!r}")
            begin, end = offs
            info = TensorInfo(name, shape, dtype)
            if not 0 <= begin <= end or end - begin != info.nbytes:
                raise InputError(
                    f"{p}: tensor {name!r}: data_offsets {offs} do not match shape {list(shape)} x {code}"
                )
            if end > data_size:
                raise InputError(f"{p}: tensor {name!r}: data_offsets {offs} run past the end of the file (truncated?)")
            entries.append((begin, end, info))
        entries.sort(key=itemgetter(0, 1))
        last_end = 0
        for begin, end, info in entries:
            if begin < last_end and end > begin:
                raise UnsafeInputError(f"{p}: tensor {info.name!r} overlaps another tensor's data")
            last_end = max(last_end, end)
        self._offsets = {info.name: begin for begin, _, info in entries}
        self.tensors = [info for _, _, info in entries]

    def _read(self, info: TensorInfo) -> np.ndarray:
        return self._read_at(self._fd, self._data_start + self._offsets[info.name], info, info.shape)

    def iter_chunks(self, info: TensorInfo, chunk_elements: int = 1 << 16) -> Iterator[np.ndarray]:
        return self._pread_chunks(self._fd, self._data_start + self._offsets[info.name], info, chunk_elements)

    def raw_location(self, info: TensorInfo) -> tuple[int, int] | None:
        return self._checked_location(self._fd, self._data_start + self._offsets[info.name], info)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


class SafetensorsWriter(DumpWriter):
    """The header needs every offset, so tensors are collected as (info, array) lazily by the caller via
    :meth:`plan`, then streamed. ``add`` in plan order writes data sequentially."""

    format = "safetensors"

    def __init__(self, path: str, metadata: dict[str, Any] | None = None):
        super().__init__(path, metadata)
        self._f = open_output(path)
        self._planned: list[TensorInfo] | None = None
        self._next = 0

    def plan(self, infos: list[TensorInfo], *, data_phase: int | None = None) -> None:
        """Write the header for these tensors (names, shapes, dtypes in this order), padded with spaces to
        a multiple of 8 bytes as the format allows, and further (less than a page) so that the data starts
        at ``data_phase`` within a page when that is a multiple of 8."""
        header: dict[str, Any] = {}
        if self.metadata:
            header["__metadata__"] = {
                str(k): v if isinstance(v, str) else json.dumps(v) for k, v in self.metadata.items()
            }
        offset = 0
        for info in infos:
            dt = info.dtype if isinstance(info.dtype, DeferredDtype) else np.dtype(info.dtype)
            code = code_of(dt.newbyteorder("<") if dt.byteorder == ">" else dt)
            if code is None:
                raise InputError(f"cannot write tensor {info.name!r} of dtype {info.dtype} as safetensors")
            header[info.name] = {"dtype": code, "shape": list(info.shape), "data_offsets": [offset, offset + info.nbytes]}
            offset += info.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        if data_phase is not None and data_phase % 8 == 0:
            raw += b" " * ((data_phase - 8 - len(raw)) % PAGE)
        self._f.write(struct.pack("<Q", len(raw)) + raw)
        preallocate(self._f.fileno(), 0, 8 + len(raw) + offset)  # the file's exact size
        self._planned = list(infos)

    def _entry(self, method: str, name: str, dtype: np.dtype,
               shape: tuple[int, ...] | None = None, ahead: int = 0) -> TensorInfo:
        """The next planned header entry (``ahead``: the one so many after it), which the tensor about to be
        written (by ``method``) must match."""
        if self._planned is None:
            raise RuntimeError(f"SafetensorsWriter.plan() must be called before {method}()")
        if self._next + ahead >= len(self._planned):
            raise RuntimeError(f"tensor {name!r} is not in the planned header")
        expect = self._planned[self._next + ahead]
        if expect.name != name or expect.dtype != dtype or (shape is not None and shape != expect.shape):
            raise RuntimeError(f"tensor {name!r} does not match the planned header entry {expect.name!r}")
        return expect

    def add(self, info: TensorInfo, array: np.ndarray) -> None:
        self._entry("add", info.name, array.dtype, tuple(array.shape))
        a = np.ascontiguousarray(array)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        write_all(self._f, memoryview(a.reshape(-1).view(np.uint8)))
        self._next += 1

    def add_chunks(self, info: TensorInfo, chunks: Any) -> None:
        expect = self._entry("add_chunks", info.name, info.dtype)
        written = 0
        self.data_offset = self._f.tell()
        for c in chunks:
            c = np.ascontiguousarray(c)
            if c.dtype.byteorder == ">":
                c = c.astype(c.dtype.newbyteorder("<"))
            write_all(self._f, memoryview(c.view(np.uint8)))
            written += c.nbytes
        self.data_offset = None
        if written != expect.nbytes:
            raise RuntimeError(f"tensor {info.name!r}: wrote {written} bytes, planned {expect.nbytes}")
        self._next += 1

    def add_run(self, infos: list[TensorInfo], data: np.ndarray) -> None:
        """Tensors stored back to back, as safetensors stores them: their bytes written at once (a
        little-endian machine's, or one-byte types'; else one at a time)."""
        if sys.byteorder != "little" and any(i.dtype.itemsize > 1 for i in infos):
            return super().add_run(infos, data)
        for k, info in enumerate(infos):
            expect = self._entry("add_run", info.name, info.dtype, ahead=k)
            if expect.nbytes != info.nbytes:
                raise RuntimeError(f"tensor {info.name!r}: {info.nbytes} bytes, planned {expect.nbytes}")
        if sum(i.nbytes for i in infos) != len(data):
            raise RuntimeError("add_run: the bytes are not the tensors'")
        write_all(self._f, memoryview(data))
        self._next += len(infos)

    def add_copy(self, info: TensorInfo, source: tuple[int, int], where: str) -> bool:
        """The tensor's bytes copied by the kernel (:func:`copy_range`): safetensors stores them raw, in
        little-endian order, so this applies on a little-endian machine (or to one-byte types)."""
        expect = self._entry("add_copy", info.name, info.dtype)
        if sys.byteorder != "little" and info.dtype.itemsize > 1:
            return False
        self._f.flush()
        start = self._f.tell()
        copy_range(source, self._f.fileno(), start, expect.nbytes, where)
        self._f.seek(start + expect.nbytes)
        self._next += 1
        return True

    def close(self) -> None:
        if self._planned is None:
            self.plan([])
        self._f.close()
