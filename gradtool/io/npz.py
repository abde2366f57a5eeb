"""NumPy ``.npz`` archives (stored or deflate-compressed zip of .npy members), read lazily and safely.

Each member ``NAME.npy`` is the tensor ``NAME``; the member ``__metadata__.json`` (written by gradtool)
holds the dump's metadata (step, loss, ...). Opening reads the zip directory and each member's .npy
header only. Member data is checked against its header before anything is allocated: a member whose
header claims more bytes than it holds, or whose compression ratio is impossible for deflate, is refused.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import GradtoolError, InputError, UnsafeInputError, listed
from .atomic import open_output, preallocate
from .base import (DumpReader, DumpWriter, PhasedBuffer, TensorInfo, allocate, buffer_phase, fill_view, pread_at,
                   read_ahead, write_all)
from .detect import head_of
from .npy import (check_writable_dtype, npy_header_bytes, parse_npy_header, read_npy_data, read_npy_header, write_npy,
                  write_npy_chunks)

METADATA_MEMBER = "__metadata__.json"
MAX_DEFLATE_RATIO = 1100  # deflate cannot exceed ~1032:1
# what zipfile raises on broken or exotic archives (unsupported versions, encryption, methods: found by fuzzing)
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, NotImplementedError,
              ValueError, RuntimeError, IndexError, KeyError, struct.error, UnicodeDecodeError)
ALIGN = 64
PAD_EXTRA_ID = 0x6770  # an unregistered zip extra-field id holding padding
ZIP64_LOCAL_EXTRA = 20  # zipfile writes a 20-byte ZIP64 extra in local headers when force_zip64=True
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the zip epoch for every member: no wall-clock time in the output
# bytes read past a member's local header while indexing, to take its .npy header in the same pread: a
# ZIP64 extra (20), gradtool's alignment padding (< 64) and NumPy's header (128 for most shapes)
HEADER_LOOKAHEAD = 512


def _not_npz(members: list[str]) -> str:
    """Why a zip archive whose members (``members``, none a ``.npy``) hold no tensor is no .npz dump:
    a PyTorch ``torch.save`` file (``*/data.pkl`` with its storages) is named as one, for gradtool would
    otherwise read it as a dump of no tensors, global norm 0."""
    from .detect import NEVER_PICKLES

    if any(m == "data.pkl" or m.endswith("/data.pkl") for m in members):
        return f"is a PyTorch torch.save file (a zip of pickled tensors); {NEVER_PICKLES}"
    if any(m.endswith(".pkl") for m in members):
        return f"is a zip of pickles (PyTorch?), not an .npz dump; {NEVER_PICKLES}"
    return (f"is a zip archive with no .npy member ({len(members)} other: {listed(members, 3, repr)}), "
            "not an .npz dump")


class NpzReader(DumpReader):
    format = "npz"

    def __init__(self, path: str, *, display_path: str | None = None):
        super().__init__(path, display_path=display_path)
        try:
            self._zip = zipfile.ZipFile(path, "r")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
            # a zip that zipfile cannot open although it starts as one (PK\3\4) lacks its end, the
            # directory a writer appends last
            if isinstance(exc, zipfile.BadZipFile) and head_of(path, 4) == b"PK\x03\x04":
                raise InputError(f"{self.display_path}: truncated .npz archive: the zip directory that ends it "
                                 "is missing (cut short, or still being written)") from None
            raise InputError(f"{self.display_path}: not a readable .npz archive ({exc})") from None
        try:  # a refused file closes what opening it opened (the archive and the raw descriptor)
            self._index()
        except ZIP_ERRORS as exc:
            self.close()
            if isinstance(exc, GradtoolError):
                raise
            raise InputError(f"{self.display_path}: corrupt .npz archive ({type(exc).__name__}: {exc})") from None
        except BaseException:
            self.close()
            raise
        self._validate_index()

    def _index(self) -> None:
        self._members: dict[str, tuple[zipfile.ZipInfo, bool]] = {}
        self._header_lengths: dict[str, int] = {}
        self._data_starts: dict[str, int] = {}  # stored members: where the data begins (read while indexing)
        self._deflated_starts: dict[str, int] = {}  # deflated members: where the compressed stream begins
        self._crc_checked: set[str] = set()  # stored members whose CRC-32 was found right
        self._crc_bad: set[str] = set()  # ... and found wrong
        self._crc_owed: set[str] = set()  # ... left to a caller that takes it as it reads them (crc_seed)
        self._stored_order: list[str] | None = None  # stored members by their place in the file (when asked)
        self._stored_rank: dict[str, int] = {}
        self.compressed = False
        p = self.display_path
        foreign: list[str] = []
        for zi in self._zip.infolist():
            if zi.is_dir():
                continue
            if zi.filename == METADATA_MEMBER:
                self.metadata = self._read_metadata(zi)
                continue
            if not zi.filename.endswith(".npy"):
                foreign.append(zi.filename)
                continue  # numpy ignores foreign members too; they are not tensors
            name = zi.filename[: -len(".npy")]
            if zi.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise InputError(f"{p}: member {zi.filename!r} uses an unsupported zip compression")
            if zi.compress_type == zipfile.ZIP_DEFLATED:
                self.compressed = True
                if zi.file_size > zi.compress_size * MAX_DEFLATE_RATIO + 4096:
                    raise UnsafeInputError(f"{p}: member {zi.filename!r} claims an impossible compression ratio (zip bomb?)")
            try:
                if zi.compress_type == zipfile.ZIP_STORED and not zi.flag_bits & 0x1:
                    # pread at the member's offset: zipfile's member objects cost ~3 ms a dump
                    start, ahead = self._local_header(zi, HEADER_LOOKAHEAD)
                    self._data_starts[name] = start
                    f = _MemberBytes(self._fd(), start, zi.file_size, ahead)
                    shape, dtype, fortran, hlen = read_npy_header(f, name, p)
                elif (head := self._deflated_head(zi, name)) is not None:  # (the usual deflated member)
                    shape, dtype, fortran, hlen = parse_npy_header(head, name, p)
                else:
                    with self._zip.open(zi) as f:
                        shape, dtype, fortran, hlen = read_npy_header(f, name, p)
            except ZIP_ERRORS as exc:
                raise InputError(f"{p}: member {zi.filename!r} is corrupt ({exc})") from None
            info = TensorInfo(name, shape, dtype, compression="gzip" if zi.compress_type else None, fortran=fortran)
            if zi.file_size - hlen != info.nbytes:
                raise InputError(
                    f"{p}: member {zi.filename!r}: header claims {info.nbytes} data bytes but the member holds "
                    f"{zi.file_size - hlen} (truncated or corrupt)"
                )
            self._members[name] = (zi, fortran)
            self._header_lengths[name] = hlen
            self.tensors.append(info)
        if foreign and not self.tensors:
            raise InputError(f"{p}: {_not_npz(foreign)}")

    def _deflated_head(self, zi: zipfile.ZipInfo, name: str) -> bytes | None:
        """The whole ``.npy`` header of a deflated member (at its start, a few hundred bytes), inflated from
        the HEADER_LOOKAHEAD bytes read with its local header (one ``pread``: ``zipfile.open`` and its
        member object cost ~50 us a member, 1 s for 20,000); None when that does not hold it (an encrypted
        member, a header longer than those bytes inflate to, bytes zlib refuses): zipfile reads it then,
        and reports what is wrong. Where the stream starts is kept for :meth:`inflate_members`."""
        if zi.compress_type != zipfile.ZIP_DEFLATED or zi.flag_bits & 0x1:
            return None
        start, ahead = self._local_header(zi, HEADER_LOOKAHEAD)
        self._deflated_starts[name] = start
        try:
            head = zlib.decompressobj(-15).decompress(ahead[: zi.compress_size], 1 << 16)
        except zlib.error:
            return None
        if len(head) < 12 or head[:6] != b"\x93NUMPY" or head[6] not in (1, 2, 3):
            return None
        prefix, length = (10, struct.unpack_from("<H", head, 8)[0]) if head[6] == 1 else \
            (12, struct.unpack_from("<I", head, 8)[0])
        return head[: prefix + length] if len(head) >= prefix + length else None

    def _read_metadata(self, zi: zipfile.ZipInfo) -> dict[str, Any]:
        if zi.file_size > 1 << 20:
            raise UnsafeInputError(f"{self.display_path}: metadata member is larger than 1 MiB")
        try:
            meta = json.loads(self._zip.read(zi).decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError, *ZIP_ERRORS) as exc:
            raise InputError(f"{self.display_path}: malformed {METADATA_MEMBER} ({exc})") from None
        if not isinstance(meta, dict):
            raise InputError(f"{self.display_path}: {METADATA_MEMBER} is not a JSON object")
        return meta

    def _read(self, info: TensorInfo) -> np.ndarray:
        zi, fortran = self._members[info.name]
        if self._deflated(zi):
            return self._inflate_whole(zi, info, fortran)
        offset = self._stored_data_offset(info)
        if offset is not None:
            return self._read_stored(zi, info, fortran, offset)
        try:
            with self._zip.open(zi) as f:
                read_npy_header(f, info.name, self.display_path)
                return read_npy_data(f, info, fortran, self.display_path)
        except ZIP_ERRORS as exc:
            raise InputError(f"{self.display_path}: member {zi.filename!r} is corrupt ({exc})") from None

    def _read_stored(self, zi: zipfile.ZipInfo, info: TensorInfo, fortran: bool, offset: int) -> np.ndarray:
        """A stored member read by ``pread`` straight into its array (placed for its offset), its CRC-32
        checked as zipfile checks it. zipfile's member reader copies every byte twice and takes the CRC
        in its own pass: reading every tensor of the 500 MB GPT-2 npz took 1.0-1.2 s that way, against
        0.29 s for the same tensors in a safetensors file. The verdict is shared with
        :meth:`_verify_stored`'s: a member checked by either is not checked again."""
        from .inflate import fast_crc32

        if info.name in self._crc_bad:
            raise self._bad_crc(zi)
        fd = self._fd()
        out = self._read_at(fd, offset, info, info.shape[::-1] if fortran else info.shape)
        if info.name not in self._crc_checked:
            data = memoryview(out.reshape(-1).view(np.uint8))
            crc32 = fast_crc32()  # isal's or the compiled reader's where at hand: zlib's values, 3-5x faster
            if crc32(data, self._header_crc(info, crc32)) != zi.CRC:
                self._crc_bad.add(info.name)
                raise self._bad_crc(zi)
            self._crc_checked.add(info.name)
        if not out.dtype.isnative:
            out = out.astype(out.dtype.newbyteorder("="))
        return out.T if fortran else out

    INFLATE_PIECE = 8 << 20  # compressed bytes read, and inflated bytes produced, per zlib call
    READ_AHEAD_BYTES = 1 << 20  # members inflated a few chunks ahead on a thread of their own from this size

    def _deflated(self, zi: zipfile.ZipInfo) -> bool:
        return zi.compress_type == zipfile.ZIP_DEFLATED and not zi.flag_bits & 0x1

    def _inflate_stream(self, zi: zipfile.ZipInfo) -> Any:
        """The member's bytes (.npy header, then array data) as an :class:`~.inflate.InflateStream`:
        inflated INFLATE_PIECE at a time by zlib calls that release the GIL (zipfile's own reader inflates
        in small GIL-holding steps), by python-isal's faster zlib when installed; size and CRC-32 are
        checked at the end, as zipfile would. Where the stream starts was found while indexing (else
        its local header is read again)."""
        from .inflate import InflateStream

        start = self._deflated_starts.get(zi.filename[: -len(".npy")])
        return InflateStream(self._fd(), self._local_data_start(zi) if start is None else start, zi.compress_size,
                             zi.file_size, zi.CRC, self.INFLATE_PIECE)

    SPAN_SLACK = 64 << 10  # inflate_members reads its members in one pread unless that reads this much more

    def inflates_whole(self, info: TensorInfo) -> bool:
        """Whether :meth:`inflate_members` takes tensor ``info``: a deflated member indexed from its local
        header whose compressed size is one deflate can give (it grows data by ~0.03 % at most: larger
        claims are read the usual way, which says what is wrong)."""
        zi = self._members[info.name][0]
        return info.name in self._deflated_starts and zi.compress_size <= zi.file_size + (zi.file_size >> 8) + 1024

    def inflate_members(self, infos: Sequence[TensorInfo], out: np.ndarray | None = None) -> list[memoryview | None]:
        """The data bytes (after the .npy header, in file order) of each deflated member of ``infos``,
        inflated whole, its size and CRC-32 checked as :meth:`_inflate_stream` checks them: for many small
        members at once (20,000 of 4-20 KB), their compressed bytes from one ``pread`` where they lie
        together in the file, inflated by one call of the compiled ``inflate_raw`` (which lets go of the
        GIL for all of them: a thread can inflate while another writes), else one inflate call each,
        without a stream object and its Python a piece (~100 us a member). ``out`` (uint8, at least the
        members' data bytes long): where the data go, one member after another (each view is then a
        slice of it). None for a member that is not deflated (or was not indexed from its local header)
        or that fails a check: the caller reads it its usual way, which reports what is wrong."""
        from .compiled import member_inflater
        from .inflate import decompress_exactly, fast_crc32

        spans = [(self._deflated_starts[i.name] if self.inflates_whole(i) else None, self._members[i.name][0])
                 for i in infos]
        known = [(a, a + zi.compress_size) for a, zi in spans if a is not None]
        lo, hi = min((a for a, _ in known), default=0), max((b for _, b in known), default=0)
        whole = b""
        if known and hi - lo <= sum(b - a for a, b in known) + self.SPAN_SLACK:
            whole = os.pread(self._fd(), hi - lo, lo)
        if out is None:
            out = np.empty(sum(i.nbytes for i in infos), np.uint8)
        passed = self._inflated_together(infos, spans, whole, lo, out, member_inflater()) if whole else set()
        crc32 = fast_crc32()
        views: list[memoryview | None] = []
        at = 0
        for k, (info, (start, zi)) in enumerate(zip(infos, spans)):
            place = memoryview(out)[at:at + info.nbytes]  # type: ignore[arg-type]
            at += info.nbytes
            if k in passed:
                views.append(place)
                continue
            if start is None:
                views.append(None)
                continue
            if whole:
                packed: bytes | memoryview = memoryview(whole)[start - lo: start - lo + zi.compress_size]
            else:
                packed = os.pread(self._fd(), zi.compress_size, start)
            if len(packed) != zi.compress_size:  # (a file cut short: the usual read says so)
                views.append(None)
                continue
            try:
                data = decompress_exactly(packed, zi.file_size, -15)
            except zlib.error:
                data = None
            head = self._header_lengths[info.name]
            if data is None or crc32(data) != zi.CRC or len(data) - head != info.nbytes:
                views.append(None)
                continue
            place[:] = memoryview(data)[head:]
            views.append(place)
        return views

    def _inflated_together(self, infos: Sequence[TensorInfo], spans: list[tuple[int | None, zipfile.ZipInfo]],
                           whole: bytes, lo: int, out: np.ndarray, inflate_raw: Any) -> set[int]:
        """The indices (in ``infos``) of the members that the compiled ``inflate_raw`` inflated and checked,
        their data in ``out`` one after another (the others' bytes there unspecified): those of the
        members that lie whole in ``whole`` (the file's bytes from ``lo``), in one call. Empty when the
        extension is not at hand."""
        if inflate_raw is None:
            return set()
        rows, which, at = [], [], 0
        for k, (info, (start, zi)) in enumerate(zip(infos, spans)):
            head = self._header_lengths[info.name]
            if start is not None and start + zi.compress_size - lo <= len(whole) and zi.file_size == head + info.nbytes:
                rows.append((start - lo, zi.compress_size, head, at, info.nbytes, zi.CRC))
                which.append(k)
            at += info.nbytes
        if not rows:
            return set()
        status = inflate_raw(whole, np.array(rows, np.int64).tobytes(), out)
        return {k for k, s in zip(which, status) if s == 0}

    def _worded(self, zi: zipfile.ZipInfo, call: Any) -> Any:
        """``call()``, its stream errors worded for this file and member."""
        try:
            return call()
        except ValueError as exc:
            raise InputError(f"{self.display_path}: member {zi.filename!r} is {exc}") from None

    def _inflate_whole(self, zi: zipfile.ZipInfo, info: TensorInfo, fortran: bool) -> np.ndarray:
        """A deflated member inflated straight into its array: memory is the array plus a few pieces (not
        the compressed member, the inflated bytes and the array at once), and several members inflate
        in parallel threads."""
        shape = info.shape[::-1] if fortran else info.shape
        out = allocate(TensorInfo(info.name, shape, info.dtype), self.display_path)
        stream = self._inflate_stream(zi)

        def inflate() -> None:
            stream.skip(self._header_lengths[info.name])
            stream.readinto(memoryview(out.reshape(-1).view(np.uint8)))
            stream.finish()  # a short stream fails here: size mismatch

        self._worded(zi, inflate)
        if not out.dtype.isnative:
            out = out.astype(out.dtype.newbyteorder("="))
        return out.T if fortran else out

    def inflated_chunks(self, info: TensorInfo, chunk_elements: int,
                        buffer: np.ndarray | None = None) -> Iterator[np.ndarray] | None:
        """A deflated member's elements in 1-D chunks of ``chunk_elements`` (the last shorter), in file
        order (as :meth:`iter_chunks` gives a stored member's: a Fortran-order member's too), inflated a
        piece at a time into ``buffer`` (uint8; each chunk is a view of it, valid until the next is asked
        for; give every thread its own) or the reader's buffer: memory does not grow with the tensor.
        The size and CRC-32 are checked after the last chunk. None for a member that is not deflated."""
        zi, _ = self._members[info.name]
        if not self._deflated(zi):
            return None
        return self._inflated_chunks(zi, info, chunk_elements, buffer)

    def _inflated_chunks(self, zi: zipfile.ZipInfo, info: TensorInfo, chunk_elements: int,
                         buffer: np.ndarray | None) -> Iterator[np.ndarray]:
        stream = self._inflate_stream(zi)
        self._worded(zi, lambda: stream.skip(self._header_lengths[info.name]))
        yield from self._buffered_chunks(info, chunk_elements,
                                         lambda view, pos: self._worded(zi, lambda: stream.readinto(view)), buffer)
        self._worded(zi, stream.finish)

    def _local_data_start(self, zi: zipfile.ZipInfo) -> int:
        """Where a member's data starts, from its local header, checked as ``zipfile.open`` checks it:
        the signature, the same file name as the central directory, no patched or strongly encrypted data."""
        return self._local_header(zi, 0)[0]

    def _local_header(self, zi: zipfile.ZipInfo, lookahead: int) -> tuple[int, bytes]:
        """:meth:`_local_data_start`, and the (up to) ``lookahead`` bytes read after the local header in the
        same ``pread`` (the member's .npy header while indexing: one system call a member, not four)."""
        name = zi.orig_filename.encode("utf-8" if zi.flag_bits & 0x800 else "cp437")
        local = os.pread(self._fd(), 30 + len(name) + lookahead, zi.header_offset)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            raise InputError(f"{self.display_path}: member {zi.filename!r}: bad local header")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        if local[30: 30 + len(name)] != name or name_len != len(name):
            raise InputError(f"{self.display_path}: member {zi.filename!r}: local header names another file")
        if zi.flag_bits & 0x60:
            raise InputError(f"{self.display_path}: member {zi.filename!r} uses an unsupported zip feature")
        return zi.header_offset + 30 + name_len + extra_len, local[30 + name_len + extra_len:]

    VERIFY_CRC = True  # a stored member's CRC-32 checked before its bytes are streamed (tests switch it off)
    CRC_WINDOW = 256 << 20  # stored members checked together, from the one asked for on in the file
    CRC_PIECE = 1 << 20  # ... up to this many bytes from one pread
    CRC_TASK = 8 << 20  # ... more in tasks of this many bytes on two threads

    def _verify_stored(self, info: TensorInfo) -> None:
        """Check a stored member's CRC-32 (over its .npy header and data, as zipfile and ``np.load`` check
        it) once, before the streaming and raw paths (:meth:`iter_chunks`, :meth:`raw_location`) hand out
        any of its bytes: a bit flipped on the disk or in a copy leaves every size right, and would
        otherwise give wrong statistics, or a clipped dump whose fresh CRC hides the damage."""
        if not self.VERIFY_CRC or info.name in self._crc_checked:
            return
        if info.name not in self._crc_bad:
            self._check_crcs_from(info.name)
        if info.name in self._crc_bad:
            zi, _ = self._members[info.name]
            raise self._bad_crc(zi)

    def _bad_crc(self, zi: zipfile.ZipInfo) -> InputError:
        return InputError(f"{self.display_path}: member {zi.filename!r} is corrupt (bad CRC-32)")

    def location_checked_by_caller(self, info: TensorInfo) -> tuple[int, int] | None:
        """:meth:`raw_location` without the CRC-32 check first, for a caller that takes the CRC of the bytes
        as it reads them (the compiled statistics kernel, while each chunk is in the cache: with a pass of
        its own first, the check read the 500 MB GPT-2 npz from memory twice, in-process 0.49-0.53 of a raw
        read, 0.90-0.98 in one) and settles it (:meth:`crc_seed`, :meth:`settle_crc`). The member is owed
        meanwhile: the windows of other members' checks stop at it."""
        offset = self._stored_data_offset(info)
        if offset is None:
            return None
        if self.VERIFY_CRC and info.name not in self._crc_checked:
            self._crc_owed.add(info.name)
        return self._checked_location(self._fd(), offset, info)

    def crc_seed(self, info: TensorInfo) -> int | None:
        """The CRC-32 of a stored member's .npy header (the member's CRC covers it, then the data), for the
        caller to continue over the data; None when the member is checked already, compressed (inflating
        checks it), or checks are off."""
        if not self.VERIFY_CRC or info.name in self._crc_checked or self._stored_data_offset(info) is None:
            return None
        zi, _ = self._members[info.name]
        if info.name in self._crc_bad:
            raise self._bad_crc(zi)
        return self._header_crc(info)

    def _header_crc(self, info: TensorInfo, crc32: Any = zlib.crc32) -> int:
        """The CRC-32 of a stored member's .npy header bytes (a few hundred), read by ``pread``."""
        return crc32(os.pread(self._fd(), self._header_lengths[info.name], self._data_starts[info.name]))

    def settle_crc(self, info: TensorInfo, crc: int) -> None:
        zi, _ = self._members[info.name]
        (self._crc_checked if crc == zi.CRC else self._crc_bad).add(info.name)
        self._crc_owed.discard(info.name)
        if crc != zi.CRC:
            raise self._bad_crc(zi)

    def _check_crcs_from(self, name: str) -> None:
        """Check the CRC-32 of member ``name`` and of the stored members that follow it in the file within
        CRC_WINDOW bytes, up to the first already judged (members are asked for in file order: 20,000
        members of a few KiB, a ``pread`` and a CRC call each, took 0.5 s); each is put in
        ``_crc_checked`` or ``_crc_bad``, so a damaged member is refused when it is asked for, not before. Up to CRC_PIECE bytes come from one
        ``pread``; more from one read-only map of them on two threads (:meth:`_crcs_in_map`), a
        member's parts joined by :func:`crc32_combine`."""
        from .inflate import crc32_combine, fast_crc32

        if self._stored_order is None:  # (the rank first: another thread may be here at the same moment)
            order = sorted(self._data_starts, key=self._data_starts.__getitem__)
            self._stored_rank = {n: i for i, n in enumerate(order)}
            self._stored_order = order
        begin = self._data_starts[name]
        spans = []  # (member, start, end) in file order
        for other in self._stored_order[self._stored_rank[name]:]:
            at = self._data_starts[other]
            if spans and (at + self._members[other][0].file_size - begin > self.CRC_WINDOW
                          or other in self._crc_checked or other in self._crc_bad or other in self._crc_owed):
                break  # (the window ends at a member already judged, by a whole read of it, or owed)
            spans.append((other, at, at + self._members[other][0].file_size))
        end = spans[-1][2]
        crc32 = fast_crc32()
        if end - begin <= self.CRC_PIECE:  # small members: one pread for them all
            found = self._crcs_by_pread(spans, crc32)
        else:
            found = self._crcs_in_map(spans, crc32)
        crcs: dict[str, int] = {}
        for n, crc, length in found:  # in file order: a member's parts joined
            crcs[n] = crc32_combine(crcs[n], crc, length) if n in crcs else crc
        for n, _, _ in spans:  # (a set's add is atomic: threads may check a member twice, no more)
            (self._crc_checked if crcs[n] == self._members[n][0].CRC else self._crc_bad).add(n)

    def _crcs_in_map(self, parts: list[tuple[str, int, int]], crc32: Any) -> list[tuple[str, int, int]]:
        """(member, CRC-32, length) of the parts of each (member, start, end) range of the file, in file
        order: the span of them all mapped once, read-only (a map per task cost ~0.15 ms each, a ``pread``
        copy 1.7x the time), cut into tasks of CRC_TASK bytes of the file for two threads, a task's part
        of each member one CRC call. The file's size is checked first (a map read past the end of a file
        would be a SIGBUS); where a file cannot be mapped, each task's parts are read by ``pread``."""
        import mmap
        from bisect import bisect_right
        from concurrent.futures import ThreadPoolExecutor

        lo, hi = parts[0][1], parts[-1][2]
        fd = self._fd()
        if os.fstat(fd).st_size < hi:
            raise InputError(f"{self.display_path}: truncated .npz archive (a member runs past the end of the file)")
        base = lo - lo % mmap.ALLOCATIONGRANULARITY
        try:
            m: mmap.mmap | None = mmap.mmap(fd, hi - base, access=mmap.ACCESS_READ, offset=base)
        except (OSError, ValueError):  # a file system that maps no files
            m = None
        ends = [b for _, _, b in parts]

        def task_crcs(task_lo: int) -> list[tuple[str, int, int]]:
            task_hi = min(task_lo + self.CRC_TASK, hi)
            inside = []
            for n, a, b in parts[bisect_right(ends, task_lo):]:  # the parts ending after task_lo, to task_hi
                if a >= task_hi:
                    break
                inside.append((n, max(a, task_lo), min(b, task_hi)))
            if not inside or m is None:
                return self._crcs_by_pread(inside, crc32) if inside else []
            got = []
            for n, a, b in inside:
                with whole[a - base: b - base] as piece:
                    got.append((n, crc32(piece), b - a))
            _drop_mapped_pages(m, task_lo - base, task_hi - base)
            return got

        try:
            with memoryview(m if m is not None else b"") as whole:
                with ThreadPoolExecutor(2, thread_name_prefix="gradtool-crc") as pool:
                    return [part for got in pool.map(task_crcs, range(lo, hi, self.CRC_TASK)) for part in got]
        finally:
            if m is not None:
                m.close()

    def _crcs_by_pread(self, parts: list[tuple[str, int, int]], crc32: Any) -> list[tuple[str, int, int]]:
        """:meth:`_crcs_in_map`'s result from one ``pread`` of the ranges' span into a new buffer, placed
        for the read (:func:`buffer_phase`: a bytearray lay where malloc put it, a slow copy by luck)."""
        lo, hi = parts[0][1], parts[-1][2]
        view = memoryview(PhasedBuffer().get(hi - lo, buffer_phase(reads=[lo])))
        fill_view(view, pread_at(self._fd(), lo), f"{self.display_path}: member {parts[0][0] + '.npy'!r}")
        return [(n, crc32(view[a - lo: b - lo]), b - a) for n, a, b in parts]

    def iter_chunks(self, info: TensorInfo, chunk_elements: int = 1 << 16) -> Iterator[np.ndarray]:
        zi, _ = self._members[info.name]
        offset = self._stored_data_offset(info)
        if offset is not None:
            self._verify_stored(info)
            yield from self._pread_chunks(self._fd(), offset, info, chunk_elements)
            return
        if self._deflated(zi):  # inflate as we go, one chunk at a time (in file order)
            yield from self._inflated_chunks(zi, info, chunk_elements, None)
            return
        try:
            with self._zip.open(zi) as f:  # another compression: zipfile decompresses as we go
                yield from self._stream_chunks(f, info, chunk_elements)
        except ZIP_ERRORS as exc:
            raise InputError(f"{self.display_path}: member {zi.filename!r} is corrupt ({exc})") from None

    def iter_chunks_ahead(self, info: TensorInfo, chunk_elements: int = 1 << 16) -> Iterator[np.ndarray]:
        """A deflated member inflated on a worker thread a few chunks ahead of the caller (:func:`read_ahead`;
        clip scales, checksums and deflates again on the other threads meanwhile); others as iter_chunks,
        and members of less than READ_AHEAD_BYTES, whose thread would cost more than it overlaps (20,000
        members of 200 bytes: a thread each, 8.4 s)."""
        zi, _ = self._members[info.name]
        if not self._deflated(zi) or info.size <= chunk_elements or info.nbytes < self.READ_AHEAD_BYTES:
            return self.iter_chunks(info, chunk_elements)
        return read_ahead(self.iter_chunks(info, chunk_elements))

    def raw_location(self, info: TensorInfo) -> tuple[int, int] | None:
        zi, _ = self._members[info.name]
        offset = self._stored_data_offset(info)
        if offset is None:
            return None
        self._verify_stored(info)
        return self._checked_location(self._fd(), offset, info)

    _fd_lock = threading.Lock()

    def _fd(self) -> int:
        """The raw descriptor for pread, opened once (worker threads may ask for it at the same moment)."""
        if getattr(self, "_raw_fd", None) is None:
            with self._fd_lock:
                if getattr(self, "_raw_fd", None) is None:
                    self._raw_fd = os.open(self.path, os.O_RDONLY)
        return self._raw_fd

    def _stored_data_offset(self, info: TensorInfo) -> int | None:
        """Byte offset of a stored (uncompressed) member's array data (its local header was read while
        indexing); None for a compressed or encrypted member."""
        start, hlen = self._data_starts.get(info.name), self._header_lengths.get(info.name)
        return None if start is None or hlen is None else start + hlen

    def close(self) -> None:
        self._zip.close()
        if getattr(self, "_raw_fd", None) is not None:
            os.close(self._raw_fd)
            self._raw_fd = None


class _MemberBytes:
    """``read(n)`` over a stored member's bytes by ``os.pread``: what :func:`read_npy_header` needs, without
    a zipfile member object (its local header was checked by ``_local_header``). ``ahead``: the bytes from
    ``start`` on that were read already (with the local header), served without a system call."""

    def __init__(self, fd: int, start: int, size: int, ahead: bytes = b""):
        self._fd, self._start, self._pos, self._end, self._ahead = fd, start, start, start + size, ahead

    def read(self, n: int) -> bytes:
        n = max(min(n, self._end - self._pos), 0)
        k = self._pos - self._start
        data = self._ahead[k: k + n] if k + n <= len(self._ahead) else os.pread(self._fd, n, self._pos)
        self._pos += len(data)
        return data


class NpzWriter(DumpWriter):
    """Streams members one at a time into a zip (ZIP64 always on, so members may exceed 4 GiB)."""

    format = "npz"

    def __init__(self, path: str, metadata: dict[str, Any] | None = None, *, compress: bool = False):
        super().__init__(path, metadata)
        from .inflate import fast_zipfile_crc

        fast_zipfile_crc()  # zipfile's CRC-32 of every member byte, by isal when installed
        self._pool: Any = None  # the deflate threads, started with the first compressed member
        self._file = open_output(path)
        try:
            self._zip = zipfile.ZipFile(self._file, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED,
                                        allowZip64=True)
        except BaseException:
            self._file.close()
            raise

    def plan(self, infos: list[TensorInfo], *, data_phase: int | None = None) -> None:
        """Stored members: reserve the file's space (:func:`~.atomic.preallocate`) for the least these
        tensors take, each member's local header (30 bytes and its name) and data; a member's .npy header,
        padding and ZIP64 fields and the central directory come on top."""
        if self._zip.compression == zipfile.ZIP_STORED:
            least = sum(30 + len((i.name + ".npy").encode("utf-8")) + i.nbytes for i in infos)
            preallocate(self._file.fileno(), self._zip.fp.tell(), least)

    def add(self, info: TensorInfo, array: np.ndarray) -> None:
        check_writable_dtype(array.dtype, "npz", info.name)
        with self._member(info.name + ".npy") as f:
            write_npy(f, array)

    def add_chunks(self, info: TensorInfo, chunks: Any) -> None:
        check_writable_dtype(info.dtype, "npz", info.name)
        with self._member(info.name + ".npy") as f:
            write_npy_chunks(f, info, chunks)

    def add_run(self, infos: list[TensorInfo], data: np.ndarray) -> None:
        """Each tensor as :meth:`add_chunks` writes it (the same bytes, tested), but the members that are
        stored, or deflated to one block (under :data:`~.deflate.BLOCK`), written whole by
        :meth:`_add_whole`: zipfile's writer seeks back to rewrite a member's local header once the CRC
        and sizes are known, and each seek flushes the file's buffer (20,000 small members: ~80 us a
        member, half a ``clip``'s time)."""
        pos, k = 0, 0
        while k < len(infos):
            done = self._add_whole(infos[k:], data[pos:])
            for info in infos[k:k + done]:
                pos += info.nbytes
            k += done
            if k < len(infos):  # (a member _add_whole does not write: zipfile's streaming writer)
                info = infos[k]
                self.add_chunks(info, iter([data[pos:pos + info.nbytes].view(info.dtype)]))
                pos += info.nbytes
                k += 1

    def _add_whole(self, infos: Sequence[TensorInfo], data: np.ndarray) -> int:
        """Members ``NAME.npy`` of the first tensors of ``infos``, whose data bytes (C order, native) lie
        one after another in ``data``, each local header written once with the CRC and sizes computed
        first, as zipfile's ``mkdir`` writes a directory's (the header, the bytes; then the archive's
        ``filelist``, ``NameToInfo`` and ``start_dir``); deflated as :class:`~.deflate.ParallelDeflater`
        deflates a stream of one block (here, not on its threads: the same bytes). The members are written
        after all of them are made, one seek at most for them all. Returns how many were written: it stops before a deflated member of a block
        or more (0 for all, on a zipfile without those attributes): the caller writes that one the usual
        way."""
        from .deflate import BLOCK, deflate_block, default_level
        from .inflate import fast_crc32, fast_zlib

        z = self._zip
        if not all(hasattr(z, a) for a in ("_lock", "_writing", "_writecheck", "_didModify", "start_dir", "NameToInfo")):
            return 0
        crc32 = fast_crc32()
        deflated = z.compression == zipfile.ZIP_DEFLATED
        mod = fast_zlib() if deflated else None
        level = default_level(mod) if deflated else 0
        parts: list[Any] = []
        checked: set[np.dtype] = set()  # the dtypes npz has a name for, among these
        pos = written = 0
        with z._lock:
            if z._writing:
                raise ValueError("another member is being written")
            at = z.start_dir
            try:
                for info in infos:
                    if info.dtype not in checked:
                        check_writable_dtype(info.dtype, "npz", info.name)
                        checked.add(info.dtype)
                    header = npy_header_bytes(info)
                    view = memoryview(data[pos:pos + info.nbytes])
                    size = len(header) + view.nbytes
                    if deflated and size >= BLOCK:
                        break
                    pos += info.nbytes
                    zi = self._aligned_info(info.name + ".npy", at)
                    if deflated:
                        packed = deflate_block(mod, level, header + view, b"", True)
                    zi.file_size, zi.compress_size = size, len(packed) if deflated else size
                    zi.CRC = crc32(view, crc32(header))
                    zi.flag_bits, zi.external_attr = 0, 0o600 << 16  # (what zipfile's writer gives a member)
                    zi.header_offset = at
                    z._writecheck(zi)
                    local = zi.FileHeader(True)  # (force_zip64: the ZIP64 extra, as the usual writer writes it)
                    parts += (local, packed) if deflated else (local, header, view)
                    at += len(local) + zi.compress_size
                    z.filelist.append(zi)
                    z.NameToInfo[zi.filename] = zi
                    written += 1
            finally:  # (the members listed so far written, also when one after them raised)
                if written:
                    z._didModify = True
                    if z.fp.tell() != z.start_dir:  # (a buffered file's seek flushes its buffer: not where it is)
                        z.fp.seek(z.start_dir)
                    for part in [b"".join(parts)] if deflated else parts:  # (stored: no copy of the data)
                        write_all(z.fp, part)
                    z.start_dir = at
        return written

    def _member(self, filename: str) -> Any:
        """zipfile's writer of a new member. A deflated member is compressed by a
        :class:`~.deflate.ParallelDeflater` on this writer's two threads (and by python-isal when
        installed) in place of zipfile's one-core zlib: zipfile hands every write to the member's
        ``_compressor`` (``compress``, then ``flush`` at close), which the deflater stands in for. On a
        Python whose zipfile has no such attribute, zipfile compresses as usual (slower, same format)."""
        f = self._zip.open(self._aligned_info(filename), "w", force_zip64=True)
        if self._zip.compression == zipfile.ZIP_DEFLATED and getattr(f, "_compressor", None) is not None:
            from .deflate import ParallelDeflater, thread_pool

            self._pool = self._pool or thread_pool()
            f._compressor = ParallelDeflater(self._pool)
        return f

    def _aligned_info(self, filename: str, at: int | None = None) -> zipfile.ZipInfo:
        """A member (its local header at ``at``, or where the file is) whose array data starts on a
        64-byte boundary (NumPy pads the .npy header to 64), so readers can use it in place: an extra
        field pads the local header. Unknown extra fields are ignored by every zip reader."""
        zi = zipfile.ZipInfo(filename, date_time=ZIP_DATE)
        zi.compress_type = self._zip.compression
        if self._zip.compression == zipfile.ZIP_STORED:
            start = (self._zip.fp.tell() if at is None else at) + 30 + len(filename.encode("utf-8")) + ZIP64_LOCAL_EXTRA
            pad = (-(start + 4)) % ALIGN
            zi.extra = struct.pack("<HH", PAD_EXTRA_ID, pad) + b"\0" * pad
        return zi

    def close(self) -> None:
        try:
            if self.metadata:  # the tensors' date too: the same dump gives the same bytes whenever written
                zi = zipfile.ZipInfo(METADATA_MEMBER, date_time=ZIP_DATE)
                zi.compress_type = self._zip.compression
                zi.external_attr = 0o600 << 16  # what writestr gives a member it names itself
                self._zip.writestr(zi, json.dumps(self.metadata, allow_nan=True))
            self._zip.close()
        finally:
            self._file.close()  # zipfile leaves a file object it was given open
            if self._pool is not None:
                self._pool.shutdown()


def _drop_mapped_pages(m: Any, start: int, stop: int) -> None:
    """Let go of the pages of bytes [start, stop) of read-only map ``m`` (widened to whole pages) once read:
    a page of the page cache counts in the process's RSS for as long as it is mapped, so a check's window
    of up to CRC_WINDOW bytes, mapped whole, took ``stats`` of a 245 MB npz without the kernel to 299 MB
    (the budget of target 4: ~100). ``MADV_DONTNEED`` on a file's read-only map only drops the mapping (a
    page read again faults back in from the cache), so a page a neighbouring task reads too is safe to
    drop. Where the system has no such advice, nothing."""
    import mmap

    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None:
        return
    page = mmap.PAGESIZE
    start -= start % page
    stop = min(len(m), -(-stop // page) * page)
    if stop > start:
        m.madvise(advice, start, stop - start)
