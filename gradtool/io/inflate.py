"""Deflate decoding and CRC-32 for dumps: python-isal's ``isal_zlib`` when installed, else the standard
``zlib``.

``isal_zlib`` (Intel's ISA-L, extra ``gradtool[speedups]``) has zlib's interface and inflates 2-2.5x
faster on this project's benchmark, releasing the GIL as zlib does. It only ever speeds up a success:
when it reports an error, the same bytes are inflated again by ``zlib``, whose verdict and message
stand, so a corrupt file is judged exactly as without the extra. Deflate decoding is deterministic,
so the inflated bytes are the same either way (tests run both). :class:`InflateStream` reads a raw
deflate stream (a compressed npz member) front to back into caller buffers, a piece at a time. The
CRC-32 of npz members (:func:`fast_crc32`) is isal's, else the compiled log reader's, else zlib's, all
with zlib's values: :func:`fast_zipfile_crc` lets the standard zipfile module use it for the npz
members it writes and reads.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T")

USE_ISAL = True  # tests switch it off to run the zlib path with isal installed


def fast_zlib() -> ModuleType:
    """``isal.isal_zlib`` if installed (and not switched off), else ``zlib``."""
    if USE_ISAL:
        try:
            from isal import isal_zlib
        except ImportError:
            return zlib
        return isal_zlib
    return zlib


def fast_crc32() -> Callable[..., int]:
    """``zlib.crc32(data, value=0)``'s values by the fastest function at hand: python-isal's (ISA-L, ~9
    GB/s where zlib's took 1.7-3), else the compiled log reader's (``gradtool/io/_logscan.c``: carry-less
    multiplication where the CPU has PCLMULQDQ, ~6 GB/s; tested against zlib's), else zlib's. All three
    let go of the GIL over large buffers, so a CRC runs beside the other thread's reads."""
    mod = fast_zlib()
    if mod is not zlib:
        return mod.crc32
    from .compiled import log_readers

    readers = log_readers()
    return zlib.crc32 if readers is None else readers.crc32


_CRC_POLY = 0xEDB88320  # zlib's CRC-32 polynomial, bit-reflected


def _mult_mod_p(a: int, b: int) -> int:
    """``a * b`` modulo the CRC-32 polynomial, both bit-reflected (zlib's ``multmodp``; ``a`` non-zero)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


def _powers_of_x() -> list[int]:
    """``x^(2^k)`` modulo the polynomial for k = 0..31 (zlib's ``x2n_table``)."""
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_mult_mod_p(table[-1], table[-1]))
    return table


_X2N = _powers_of_x()


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """``zlib.crc32(a + b)`` from ``crc1 = zlib.crc32(a)``, ``crc2 = zlib.crc32(b)`` and ``len2 = len(b)``
    (zlib's ``crc32_combine``, which Python's zlib does not expose): ``crc1 * x^(8 len2) + crc2`` modulo
    the polynomial, so that pieces of a member can be checked on several threads. ~30 us."""
    p, n, k = 1 << 31, len2, 3  # x^0; x^(8 len2) = product of x^(2^k) over the bits of len2, from k = 3
    while n:
        if n & 1:
            p = _mult_mod_p(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _mult_mod_p(p, crc1) ^ (crc2 & 0xFFFFFFFF)


def judged_by_zlib(work: Callable[[ModuleType], T]) -> T:
    """``work(fast_zlib())``; when isal reports an error (its own class, not a zlib.error), ``work(zlib)``
    on the same bytes, whose result or error stands."""
    mod = fast_zlib()
    if mod is not zlib:
        try:
            return work(mod)
        except mod.error:
            pass
    return work(zlib)


def decompress(data: bytes, wbits: int = zlib.MAX_WBITS) -> Any:
    """``zlib.decompress(data, wbits)``, by isal when it can; zlib decides whenever isal reports an error."""
    return judged_by_zlib(lambda mod: mod.decompress(data, wbits))


def decompress_exactly(data: bytes, size: int, wbits: int = zlib.MAX_WBITS) -> bytes | None:
    """The ``size`` bytes the zlib stream ``data`` inflates to (by isal when it can, as
    :func:`decompress`), or None when it holds more, less, or data after its end: never more than
    ``size`` + 1 bytes made (a stream of a few bytes can inflate to gigabytes)."""
    def inflate(mod: ModuleType) -> bytes | None:
        stream = mod.decompressobj(wbits)
        out = stream.decompress(data, size + 1)
        return out if len(out) == size and stream.eof and not stream.unused_data else None

    return judged_by_zlib(inflate)


def fast_zipfile_crc() -> None:
    """Let the standard ``zipfile`` module take its CRC-32 from :func:`fast_crc32`: zipfile calls its module
    global ``zipfile.crc32`` for every byte of every member it writes or reads (zlib's took 0.2 s of a
    0.45-0.55 s in-process clip of a 500 MB npz; with isal's the clip takes 0.34-0.39 s). Each returns
    zlib's value for every input (property-tested), so this changes only speed, for the whole process;
    with isal and the compiled reader switched off (or absent) zlib's is put back."""
    zipfile.crc32 = fast_crc32()


class InflateStream:
    """``readinto(view)`` over the inflated bytes of the raw deflate stream at ``fd[start, start + size)``,
    front to back, for a reader that keeps only a window of them (a streamed tensor), and :meth:`finish`,
    which checks that the stream holds exactly ``expected`` bytes whose CRC-32 is ``crc``.

    Compressed bytes are read ``piece`` at a time by ``os.pread`` and inflated by :func:`fast_zlib` (its
    calls release the GIL, so several streams inflate on several cores). When isal reports an error, the
    stream starts again with zlib, re-inflates the bytes already handed out (CRC-32 taken anew) and goes
    on from there, so zlib's verdict stands, as in :func:`judged_by_zlib`. Errors are ``ValueError``s
    whose text completes "``where`` is ..." (the caller words them for its file).
    """

    def __init__(self, fd: int, start: int, size: int, expected: int, crc: int, piece: int = 8 << 20):
        self._fd, self._start, self._size, self._piece = fd, start, size, piece
        self.expected, self.crc_expected = expected, crc
        self._restart(fast_zlib())

    def _restart(self, mod: ModuleType) -> None:
        self._mod, self._inflater, self._crc32 = mod, mod.decompressobj(-15), fast_crc32()
        self._consumed = 0  # compressed bytes read
        self._tail = b""  # compressed bytes read but not yet inflated (zlib's unconsumed_tail)
        self._flushed = False
        self._pending = memoryview(b"")  # inflated bytes counted but not yet handed out (flush ignores max_length)
        self.produced = self.crc = 0  # inflated bytes so far, and their CRC-32

    def _inflate(self, max_length: int) -> bytes:
        """At most ``max_length`` (> 0) more inflated bytes; b"" at the end of the stream."""
        while True:
            if self._tail:
                data = self._inflater.decompress(self._tail, max_length)
                self._tail = self._inflater.unconsumed_tail
            elif self._consumed < self._size:
                raw = os.pread(self._fd, min(self._piece, self._size - self._consumed), self._start + self._consumed)
                if not raw:
                    raise ValueError("truncated")
                self._consumed += len(raw)
                data = self._inflater.decompress(raw, max_length)
                self._tail = self._inflater.unconsumed_tail
            elif not self._flushed:
                data, self._flushed = self._inflater.flush(), True
            else:
                return b""
            if data:
                if self.produced + len(data) > self.expected:
                    raise ValueError("corrupt (inflates to more than its size)")
                self.crc = self._crc32(data, self.crc)
                self.produced += len(data)
                return data

    def _next(self, max_length: int) -> memoryview:
        """At most ``max_length`` (> 0) of the next inflated bytes; empty at the end of the stream."""
        if not self._pending:
            self._pending = memoryview(self._inflate(max_length))
        data, self._pending = self._pending[:max_length], self._pending[max_length:]
        return data

    def _judged(self, max_length: int) -> memoryview:
        """:meth:`_next`; isal's error restarts the stream with zlib at the same output position."""
        try:
            return self._next(max_length)
        except zlib.error as exc:
            raise ValueError(f"corrupt ({exc})") from None
        except Exception as exc:
            if self._mod is zlib or not isinstance(exc, self._mod.error):
                raise
        position = self.produced - len(self._pending)  # bytes handed out
        self._restart(zlib)
        while self.produced < position:  # the bytes already handed out, again (zlib errors judge them)
            if not self._judged(min(self._piece, position - self.produced)):
                break  # zlib ends sooner: finish() reports the size
        self._pending = self._pending[len(self._pending) - (self.produced - position):]
        return self._judged(max_length)

    def readinto(self, view: memoryview) -> int:
        """Fill ``view`` (a writable byte view) with the next inflated bytes; the count, short only at the
        end of the stream (0 there)."""
        if view.format != "B":  # a typed view is filled as bytes
            view = view.cast("B")
        filled = 0
        while filled < len(view):
            data = self._judged(min(len(view) - filled, self._piece))
            if not data:
                break
            view[filled:filled + len(data)] = data
            filled += len(data)
        return filled

    def skip(self, count: int) -> None:
        """Pass over the next ``count`` inflated bytes (ValueError "truncated" if the stream ends first)."""
        while count:
            data = self._judged(min(count, self._piece))
            if not data:
                raise ValueError("truncated")
            count -= len(data)

    def finish(self) -> None:
        """Read to the end of the stream; ValueError unless it held exactly ``expected`` bytes with the
        expected CRC-32."""
        while self._judged(self._piece):
            pass
        if self.produced != self.expected or self.crc != self.crc_expected:
            raise ValueError("corrupt (size or CRC-32 mismatch)")
