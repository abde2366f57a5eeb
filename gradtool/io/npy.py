"""NumPy ``.npy`` format: a safe header parser (no pickle, bounded sizes) and the one-tensor reader/writer.

The header is parsed with ``ast.literal_eval`` (as NumPy does) after checking its length, so a hostile
header cannot allocate or execute anything; object dtypes are refused before any data is read.
"""

from __future__ import annotations

import ast
import io
import os
import re
import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from ..errors import InputError, UnsafeInputError
from .atomic import open_output
from .base import DumpReader, DumpWriter, TensorInfo, allocate, check_dtype, check_shape, write_all

MAGIC = b"\x93NUMPY"
MAX_HEADER = 1 << 16


_DIM = r"(?:0|[1-9]\d*)"  # as Python reads an int literal: no leading zeros
_CANONICAL = re.compile(r"\{'descr': '([<>|=]?[A-Za-z]\d*)', 'fortran_order': (True|False), "
                        rf"'shape': \((|{_DIM},|{_DIM}(?:, {_DIM})+,?)\), \}}[ ]*\n?")  # (), (n,), (n, m)


def _canonical_header(header: str) -> dict[str, Any] | None:
    """The dict of a header in the exact form NumPy writes (``{'descr': '<f4', 'fortran_order': False,
    'shape': (768, 2304), }`` and padding), without ``ast.literal_eval`` (60 µs a header; a dump has
    hundreds); None for anything else (structured dtypes, other spacing), which literal_eval then parses."""
    m = _CANONICAL.fullmatch(header)
    if m is None:
        return None
    dims = m.group(3).rstrip(",")
    return {"descr": m.group(1), "fortran_order": m.group(2) == "True",
            "shape": tuple(int(v) for v in dims.split(", ")) if dims else ()}


# Headers parsed and accepted, by (major version, header bytes) -> (shape, dtype, fortran order): the
# dumps of one model's history repeat the same headers, and parsing and checking one costs ~25 us (a
# small model's tensor is read in ~100 us). What is cached passed every check, which depends on the
# header alone (a name is only in their messages). Bounded: a long history of one model needs a few
# hundred entries.
_PARSED: dict[tuple[int, bytes], tuple[tuple[int, ...], np.dtype, bool]] = {}
MAX_PARSED = 4096


def read_npy_header(f: BinaryIO, name: str, path: str) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """Parse a .npy header from ``f``: returns (shape, dtype, fortran_order, header_length_in_bytes)."""
    head = f.read(8)
    if len(head) < 8 or head[:6] != MAGIC:
        raise InputError(f"{path}: {name!r} is not a .npy array (bad magic)")
    major = head[6]
    if major == 1:
        raw = f.read(2)
        if len(raw) < 2:
            raise InputError(f"{path}: {name!r}: truncated .npy header")
        hlen = struct.unpack("<H", raw)[0]
        prefix = 10
    elif major in (2, 3):
        raw = f.read(4)
        if len(raw) < 4:
            raise InputError(f"{path}: {name!r}: truncated .npy header")
        hlen = struct.unpack("<I", raw)[0]
        prefix = 12
    else:
        raise InputError(f"{path}: {name!r}: unsupported .npy version {major}.{head[7]}")
    if hlen > MAX_HEADER:
        raise UnsafeInputError(f"{path}: {name!r}: .npy header of {hlen} bytes is too large")
    text = f.read(hlen)
    if len(text) < hlen:
        raise InputError(f"{path}: {name!r}: truncated .npy header")
    if (known := _PARSED.get((major, text))) is not None:
        return *known, prefix + hlen
    try:
        header = text.decode("utf-8" if major == 3 else "latin1")
        d = _canonical_header(header) or ast.literal_eval(header)
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        raise InputError(f"{path}: {name!r}: malformed .npy header") from None
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        raise InputError(f"{path}: {name!r}: malformed .npy header")
    try:
        dtype = np.lib.format.descr_to_dtype(d["descr"])
    except Exception:
        raise InputError(f"{path}: {name!r}: unknown dtype {d['descr']!r}") from None
    if dtype.hasobject and d["shape"] == ():  # np.save(path, grads) / np.savez(path, grads=grads) of a dict
        raise UnsafeInputError(f"{path}: tensor {name!r} is one pickled Python object (a dict of gradients "
                               "given to np.save, or to np.savez as one argument?); refusing to load it: "
                               "save the tensors themselves, np.savez(path, **grads)")
    check_dtype(dtype, name, path)
    shape = check_shape(d["shape"], name, path)
    if len(_PARSED) < MAX_PARSED:
        _PARSED[major, text] = (shape, dtype, bool(d["fortran_order"]))
    return shape, dtype, bool(d["fortran_order"]), prefix + hlen


def parse_npy_header(head: bytes, name: str, path: str) -> tuple[tuple[int, ...], np.dtype, bool, int]:
    """:func:`read_npy_header` of ``head``, the bytes of a whole header (magic, version, length and the
    dict: the index of a compressed npz inflates them); a header seen before is answered without a file
    object's three reads."""
    if len(head) >= 12 and head[:6] == MAGIC and head[6] in (1, 2, 3):
        prefix, length = (10, head[8] | head[9] << 8) if head[6] == 1 else (12, int.from_bytes(head[8:12], "little"))
        if prefix + length == len(head) and (known := _PARSED.get((head[6], head[prefix:]))) is not None:
            return *known, len(head)
    return read_npy_header(io.BytesIO(head), name, path)


def read_exact_into(f: BinaryIO, out: np.ndarray, name: str, path: str) -> None:
    """Fill ``out`` (C-contiguous) from ``f``; a short read is a truncated file."""
    view = memoryview(out.reshape(-1).view(np.uint8))
    pos = 0
    total = len(view)
    while pos < total:
        n = f.readinto(view[pos:])  # type: ignore[attr-defined]
        if not n:
            raise InputError(f"{path}: tensor {name!r} is truncated ({pos} of {total} bytes)")
        pos += n


def read_npy_data(f: BinaryIO, info: TensorInfo, fortran: bool, path: str) -> np.ndarray:
    shape = info.shape[::-1] if fortran else info.shape
    where = f.tell() if isinstance(f, (io.BufferedReader, io.FileIO)) else None  # a file: read straight in
    out = allocate(TensorInfo(info.name, shape, info.dtype), path, read_from=where)
    read_exact_into(f, out, info.name, path)
    if not out.dtype.isnative:
        out = out.astype(out.dtype.newbyteorder("="))
    return out.T if fortran else out


def check_writable_dtype(dtype: np.dtype, fmt: str, name: str) -> None:
    from ..backend import is_floating_dtype

    if dtype.kind == "V" or (is_floating_dtype(dtype) and dtype.kind != "f"):
        raise InputError(
            f"cannot write tensor {name!r} of dtype {dtype.name} as {fmt}: the format has no such dtype; "
            "write a .safetensors file instead"
        )


def write_npy(f: BinaryIO, array: np.ndarray) -> None:
    np.lib.format.write_array(f, np.asarray(array), allow_pickle=False)


def npy_header_bytes(info: TensorInfo) -> bytes:
    """The .npy header of tensor ``info`` in C order and native byte order (as its chunks arrive), padded
    as NumPy pads it (version 1.0, or 2.0 for a header of more than 65,000 bytes). Made by NumPy's
    writer once per dtype and shape (~7 us each; a model's layers repeat their shapes: 20,000 headers of
    4,000 shapes 0.14 -> 0.04 s), bounded as :data:`_PARSED` is."""
    dtype = info.dtype if info.dtype.isnative else info.dtype.newbyteorder("=")
    key = (dtype, info.shape)
    if (known := _HEADERS.get(key)) is not None:
        return known
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": info.shape}
    out = io.BytesIO()
    np.lib.format.write_array_header_2_0(out, header) if _needs_v2(header) else np.lib.format.write_array_header_1_0(out, header)
    made = out.getvalue()
    if len(_HEADERS) < MAX_PARSED:
        _HEADERS[key] = made
    return made


_HEADERS: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}  # npy_header_bytes' made headers


def write_npy_chunks(f: BinaryIO, info: TensorInfo, chunks: Any) -> None:
    """A .npy file written from 1-D C-order chunks: the header (:func:`npy_header_bytes`), then each
    chunk's bytes."""
    f.write(npy_header_bytes(info))
    for c in chunks:
        write_all(f, memoryview(np.ascontiguousarray(c).view(np.uint8)))


def _needs_v2(header: dict[str, Any]) -> bool:
    return len(repr(header)) > 65000


class NpyReader(DumpReader):
    """A single .npy file is a dump of one tensor named after the file's stem."""

    format = "npy"

    def __init__(self, path: str, *, display_path: str | None = None, name: str | None = None):
        super().__init__(path, display_path=display_path)
        self._name = name or os.path.splitext(os.path.basename(self.display_path))[0] or "tensor"
        self._f = open(path, "rb")
        try:
            shape, dtype, self._fortran, self._offset = read_npy_header(self._f, self._name, self.display_path)
            size = os.fstat(self._f.fileno()).st_size
            info = TensorInfo(self._name, shape, dtype, fortran=self._fortran)
            if size - self._offset < info.nbytes:
                raise InputError(
                    f"{self.display_path}: truncated: header claims {info.nbytes} data bytes, "
                    f"file holds {max(size - self._offset, 0)}"
                )
            self.tensors = [info]
        except BaseException:
            self._f.close()
            raise

    def _read(self, info: TensorInfo) -> np.ndarray:
        self._f.seek(self._offset)
        return read_npy_data(self._f, info, self._fortran, self.display_path)

    def iter_chunks(self, info: TensorInfo, chunk_elements: int = 1 << 16) -> Iterator[np.ndarray]:
        return self._pread_chunks(self._f.fileno(), self._offset, info, chunk_elements)

    def raw_location(self, info: TensorInfo) -> tuple[int, int] | None:
        return self._checked_location(self._f.fileno(), self._offset, info)

    def close(self) -> None:
        self._f.close()


class NpyWriter(DumpWriter):
    format = "npy"

    def __init__(self, path: str, metadata: dict[str, Any] | None = None):
        super().__init__(path, metadata)
        self._written = False

    def add(self, info: TensorInfo, array: np.ndarray) -> None:
        if self._written:
            raise InputError(f"a .npy file holds one tensor; {info.name!r} would be the second: write .npz instead")
        check_writable_dtype(array.dtype, "npy", info.name)
        with open_output(self.path) as f:
            write_npy(f, array)
        self._written = True

    def add_chunks(self, info: TensorInfo, chunks: Any) -> None:
        if self._written:
            raise InputError(f"a .npy file holds one tensor; {info.name!r} would be the second: write .npz instead")
        check_writable_dtype(info.dtype, "npy", info.name)
        with open_output(self.path) as f:
            write_npy_chunks(f, info, chunks)
        self._written = True
