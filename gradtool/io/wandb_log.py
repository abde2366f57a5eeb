"""Weights & Biases run logs as gradient-norm histories, read without wandb.

Every W&B run, online or offline, writes its transaction log locally:
``wandb/run-<date>_<time>-<id>/run-<id>.wandb`` (``offline-run-...`` offline; ``wandb/latest-run`` links
the last). The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version), then 32 KiB
blocks of records ``[crc32 u32][length u16][type u8][data]``, a record's data split over blocks as
FIRST/MIDDLE/LAST parts; each whole record is a protobuf ``wandb_internal.Record``. Only its history
records are read (``Record.history`` = 2: ``HistoryRecord.item`` = 1 of ``HistoryItem{key = 1, nested_key
= 2, value_json = 16}``, ``HistoryRecord.step`` = 2 of ``HistoryStep{num = 1}``), with a protobuf wire
decoder (:mod:`~gradtool.io.protowire`): no wandb or protobuf import. The Hugging Face Trainer logs
``train/grad_norm``, ``train/loss``, ``train/learning_rate`` and ``train/global_step`` there.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import InputError
from .detect import WANDB_MAGIC
from .protowire import _tag_at, _varint, proto_fields
from .runs import Run, choose_run, walk

BLOCK = 32768
_HEADER = 7  # of the file, and of each record
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
_SEED = {t: zlib.crc32(bytes([t])) for t in (_FULL, _FIRST, _MIDDLE, _LAST)}  # each type's CRC seed
MAX_RECORD = 64 << 20  # a longer record (a huge config or console burst, never a history row) is skipped
_RUN_DIR = re.compile(r"(?:offline-)?run-(\d{8}_\d{6})-(\w+)$")


def is_wandb_log(head: bytes) -> bool:
    return head.startswith(WANDB_MAGIC)


def log_records(path: str, source: str, fast: Callable[[bytes, int], int] | None = None) -> Iterator[bytes]:
    """The whole records of the W&B log at ``path``, read a block at a time. A record cut off at the end
    (a run still writing, or killed) ends the log; a damaged record before the last block is an
    InputError. ``fast(block, at)``, when given, reads the whole records it can from byte ``at`` of a block
    itself (the compiled reader: :class:`_Rows`) and returns where it stopped (-1: the rest of the block
    is unused); the records it read are not yielded, the one it stopped at is read here."""
    from .logs import MAX_LOG_BYTES

    size = os.path.getsize(path)
    if size > MAX_LOG_BYTES:
        raise InputError(f"{source}: log larger than {MAX_LOG_BYTES >> 30} GiB")
    with open(path, "rb") as f:
        block = f.read(BLOCK)
        if not is_wandb_log(block):
            raise InputError(f"{source}: not a W&B run log (no :W&B header)")
        block_start, at = 0, _HEADER
        pieces: list[bytes] = []
        held = 0
        while block:
            while BLOCK - at >= _HEADER and at + _HEADER <= len(block):
                if fast is not None and not pieces:
                    at = fast(block, at)
                    if at < 0 or BLOCK - at < _HEADER or at + _HEADER > len(block):
                        break
                crc, length, kind = struct.unpack_from("<IHB", block, at)
                if kind == 0 and length == 0 and crc == 0:  # zeros: the rest of the block is unused
                    break
                data = block[at + _HEADER:at + _HEADER + length]
                if (len(data) < length or kind not in _SEED
                        or zlib.crc32(data, _SEED[kind]) & 0xFFFFFFFF != crc):
                    if block_start + BLOCK >= size:
                        return  # in the last block: a write cut off (a run still going, or killed)
                    raise InputError(f"{source}: damaged W&B log (bad record at byte {block_start + at})")
                at += _HEADER + length
                if kind == _FULL:
                    pieces, held = [], 0
                    yield data
                elif kind == _FIRST:
                    pieces, held = [data], len(data)
                elif pieces:
                    held += len(data)
                    pieces.append(data)
                    if held > MAX_RECORD:  # memory stays bounded whatever the file says
                        pieces, held = [], 0
                    elif kind == _LAST:
                        yield b"".join(pieces)
                        pieces, held = [], 0
            block_start += BLOCK
            block, at = f.read(BLOCK), 0


_NUMBER_STARTS = frozenset(b"-0123456789NI")  # what a JSON number, NaN, Infinity, -Infinity start with


def _number(value: bytes) -> float | int | None:
    """A history value's JSON text as a number (``3``, ``0.5``, ``NaN``, ``Infinity``); None for anything
    else (the JSON of an image, a table, a string)."""
    if value and value[0] not in _NUMBER_STARTS:
        return None
    try:
        return int(value) if value.isdigit() else float(value)  # float() takes NaN, Infinity, -Infinity
    except ValueError:
        return None


def history_rows(record: bytes) -> dict[str, Any] | None:
    """The metrics of one history record, ``{key: number, ..., "_step": n}``; None for other records.
    Values that are not numbers (images, tables, histograms) are left out, and so are fields of another
    wire type than the schema's (a damaged or hostile file's). ValueError on malformed data.

    Fast path: an item laid out as wandb writes it, ``0a L 0a KL <key> 82 01 VL <value_json>`` with
    every length one byte (L < 128), is read by indexing alone (2x faster than the general field reader,
    which reads anything else: :func:`_item_fields`; property-tested to give the same rows)."""
    history = _first_message(record, 2)
    if history is None:
        return None
    row: dict[str, Any] = {}
    i, n = 0, len(history)
    while i < n:
        if history[i] == 0x0A and i + 1 < n and (size := history[i + 1]) < 0x80 and (end := i + 2 + size) <= n:
            k = history[i + 3] if size >= 5 else 0x80  # the key's length (0x80: no room for the layout)
            if (k < 0x80 and history[i + 2] == 0x0A and 5 + k <= size and history[i + 4 + k] == 0x82
                    and history[i + 5 + k] == 0x01 and history[i + 6 + k] == size - 5 - k):
                number = _number(history[i + 7 + k:end])
                if number is not None:
                    row[history[i + 4:i + 4 + k].decode("utf-8", "replace")] = number
                i = end
                continue
        t, v, i = _tag_at(history, i, n)  # any other field or layout
        f = t >> 3
        if f == 1 and type(v) is bytes:  # an item
            key, number = _item_fields(v)
            if number is not None:
                row[key] = number
        elif f == 2 and type(v) is bytes:  # the step
            row["_step"] = _step_num(v)
    return row


def _step_num(step: bytes) -> int:
    """``HistoryStep.num``: its first varint field numbered 1 (0 when none); when that is its first field
    (``08 <varint>``, as wandb writes it), read without the field reader."""
    if step[:1] == b"\x08":
        return _varint(step, 1)[0]
    return next((w for g, w in proto_fields(step) if g == 1 and type(w) is int), 0)


def _item_fields(item: bytes) -> tuple[str, float | int | None]:
    """(key, number) of a ``HistoryItem`` message: its ``key``, else its ``nested_key`` parts joined by
    dots; its ``value_json`` as a number (None for other values)."""
    key, nested, value = "", [], b""
    for g, w in proto_fields(item):
        if type(w) is not bytes:
            continue
        if g == 1:
            key = w.decode("utf-8", "replace")
        elif g == 2:
            nested.append(w.decode("utf-8", "replace"))
        elif g == 16:
            value = w
    return key or ".".join(nested), _number(value)


def _first_message(buf: bytes, field: int) -> bytes | None:
    """The first length-delimited field numbered ``field`` of the message ``buf`` (the fields before it
    read and checked, those after not); None when it has none."""
    i, n = 0, len(buf)
    while i < n:
        t, v, i = _tag_at(buf, i, n)
        if t >> 3 == field and type(v) is bytes:
            return v
    return None


def run_header(path: str, records: int = 64) -> tuple[str | None, str | None, float | None]:
    """(run ID, display name, start time in seconds) of the run, from the run record near the start of
    its log (``Record.run`` = 17: ``RunRecord.run_id`` = 1, ``display_name`` = 8, the Trainer's
    ``run_name``; ``start_time`` = 17, a Timestamp of seconds = 1 and nanos = 2); Nones when absent."""
    try:
        for n, record in enumerate(log_records(path, path)):
            for f, v in proto_fields(record):
                if f == 17 and isinstance(v, bytes):
                    fields = dict(proto_fields(v))
                    rid, name = (fields.get(k) for k in (1, 8))
                    start = dict(proto_fields(fields[17])) if isinstance(fields.get(17), bytes) else {}
                    started = start[1] + start.get(2, 0) / 1e9 if isinstance(start.get(1), int) else None
                    return (rid.decode("utf-8", "replace") if isinstance(rid, bytes) and rid else None,
                            name.decode("utf-8", "replace") if isinstance(name, bytes) and name else None,
                            started)
            if n >= records:
                break
    except (InputError, ValueError, OSError):
        pass
    return None, None, None


def _compiled_reader() -> Any:
    """The compiled history reader (gradtool/io/_logscan.c: its ``wandb_block`` and ``wandb_record``), or
    None (see :mod:`~gradtool.io.compiled`): the Python reader then reads every record (the same rows,
    ~12 µs a record of eight values instead of ~0.5)."""
    from .compiled import log_readers

    return log_readers()


def _vectorized() -> bool:
    """Whether the NumPy reader (:mod:`~gradtool.io.wandb_vectorized`) reads the rows where the compiled
    one is not built (tests turn it off to compare it with the Python reader)."""
    return True


# wandb's own per-row keys: no norm, step, loss or learning rate (their values are not parsed unless
# --key names one)
_UNREAD = frozenset({b"_runtime", b"_timestamp"})


class _Rows:
    """The numeric items of a log's history rows, in logging order, as columns (``values``, ``rows``,
    ``ids``: bytearrays of float64, int32 and int32 key << 1 | is_int; ``keys``: bytes -> index, in
    first-seen order): filled by the compiled reader (:meth:`scan`, given to :func:`log_records`, and
    :meth:`record`) or the NumPy one (:mod:`~gradtool.io.wandb_vectorized`, through :meth:`extend`) and,
    where they leave a record, from :func:`history_rows` (:meth:`add`). ``skip``: the keys whose floats
    nobody reads (wandb's own, unless --key names one). ``exact`` is False once an integer beyond 2^53 was
    logged (float64 cannot hold it: the rows are read again as dicts)."""

    def __init__(self, reader: Any, key: str | None):
        self._reader = reader
        self.rows = 0
        self.keys: dict[bytes, int] = {}
        self.values, self._rows, self.ids = bytearray(), bytearray(), bytearray()
        self.skip = set(_UNREAD - {key.encode("utf-8", "replace")} if key else _UNREAD)
        table = getattr(reader, "key_table", None)  # the keys looked up once a log, not once a record
        self._out = (self.keys, self.values, self._rows, self.ids, self.skip) + ((table(),) if table else ())
        self.exact = True

    def extend(self, values: Any, rows: Any, ids: Any, n_rows: int, exact: bool) -> None:
        """Items of ``n_rows`` more rows as arrays: float64 ``values``, their ``rows`` (int32, this log's
        numbering) and ``ids`` (int32 key << 1 | is_int); ``exact``: see above."""
        self.values += values.astype("<f8").tobytes()
        self._rows += rows.astype("<i4").tobytes()
        self.ids += ids.astype("<i4").tobytes()
        self.rows += n_rows
        self.exact &= exact

    def scan(self, block: bytes, at: int) -> int:
        stop, rows = self._reader.wandb_block(block, at, self.rows, self._out)
        self.rows += rows
        return stop

    def record(self, data: bytes) -> None:
        """One whole record (joined from its parts by :func:`log_records`)."""
        got = self._reader.wandb_record(data, self.rows, self._out)
        if got < 0:
            row = history_rows(data)
            if row is not None:
                self.add(row)
        else:
            self.rows += got

    def add(self, row: dict[str, Any]) -> None:
        for key, value in row.items():
            exact = type(value) is not int or -(1 << 53) <= value <= 1 << 53
            self.exact &= exact
            k = self.keys.setdefault(key.encode(), len(self.keys))
            self.values += struct.pack("<d", float(value) if exact else 0.0)
            self._rows += struct.pack("<i", self.rows)
            self.ids += struct.pack("<i", k << 1 | (type(value) is int))
        self.rows += 1

    def columns(self) -> Any:
        """The rows as :class:`~gradtool.io.logs.KeyColumns`, one column per key made from the items by the
        compiled ``item_columns`` (10^6 rows of eight values: ~0.03 s, against ~0.4 s for :meth:`items`
        and the columns ``from_row_items`` takes from them); None when keys of different bytes decode alike
        (:meth:`items` merges them) or the columns would take more than twice the items' bytes (a log of
        many keys, each in few rows)."""
        from .logs import KeyColumns

        names = [k.decode("utf-8", "replace") for k in self.keys]
        scatter = getattr(self._reader, "item_columns", None)
        if scatter is None or len(set(names)) != len(names) or \
                len(names) * self.rows * 9 > max(2 * 16 * (len(self.values) // 8), 1 << 20):
            return None
        values, flags = scatter(self.values, self._rows, self.ids, self.rows, len(names))
        return KeyColumns.of_buffers(self.rows, names, values, flags)

    def items(self) -> Any:
        """The rows as :class:`~gradtool.io.logs.RowItems` (views of the columns, not copies)."""
        import numpy as np

        from .logs import RowItems

        names: dict[str, int] = {}  # keys of different bytes that decode alike are one key, as in dicts
        merged = [names.setdefault(k.decode("utf-8", "replace"), len(names)) for k in self.keys]
        ids = np.frombuffer(self.ids, dtype=np.int32)
        key = ids >> 1
        if merged != list(range(len(merged))):
            key = np.asarray(merged, dtype=np.int32)[key]
        return RowItems(self.rows, list(names), np.frombuffer(self._rows, dtype=np.int32), key,
                        np.frombuffer(self.values, dtype=np.float64), (ids & 1).astype(bool))


def _read_each(path: str, source: str, consume: Callable[[bytes], None],
               fast: Callable[[bytes, int], int] | None = None) -> None:
    """``consume`` each whole record of the W&B run log at ``path`` (``fast``: see :func:`log_records`);
    a malformed record or a failed read is an InputError naming ``source``."""
    try:
        for record in log_records(path, source, fast):
            consume(record)
    except ValueError as exc:
        raise InputError(f"{source}: damaged W&B record ({exc})") from None
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror or exc})") from None


def _row_items(path: str, source: str, reader: Any, key: str | None = None, columns: bool = False) -> Any:
    """The history rows of the W&B run log at ``path`` as :class:`~gradtool.io.logs.RowItems` (with
    ``columns``: as :class:`~gradtool.io.logs.KeyColumns` where they fit, see :meth:`_Rows.columns`), read
    by the compiled ``reader`` and, where it leaves a record, by :func:`history_rows`; None when a value
    needs the rows as dicts (an integer beyond 2^53). ``key``: the norm's key given with --key (its values
    are read whatever it is)."""
    from .wandb_vectorized import read_rows

    rows = _Rows(reader, key)
    if reader is not None:
        _read_each(path, source, rows.record, rows.scan)
    elif not _vectorized() or not read_rows(path, source, rows):
        return None
    if not rows.exact:
        return None
    return (rows.columns() if columns else None) or rows.items()


def _rows_of(path: str, source: str) -> list[dict[str, Any]]:
    """The history rows of the W&B run log at ``path`` (``source`` names it in errors), in logging order."""
    rows: list[dict[str, Any]] = []

    def keep(record: bytes) -> None:
        row = history_rows(record)
        if row is not None:
            rows.append(row)

    _read_each(path, source, keep)
    return rows


def read_wandb_log(path: str, key: str | None = None, source: str | None = None,
                   run: Run | None = None) -> Any:
    """The norm history in the W&B run log at ``path`` (with ``run``: in that run's logs, in order, a
    resumed run's continuing the first). Steps are the trainer's when it logs them (``train/global_step``
    of the Hugging Face Trainer, ``trainer/global_step`` of Lightning, ``global_step``: see
    :data:`~gradtool.io.logs.STEP_KEYS`), else W&B's own step counter ``_step``, which counts log calls;
    a step logged again keeps its later value."""
    from .logs import from_records, from_row_items, joined_row_items

    source = source or path
    parts = run.parts if run is not None and run.parts else (path,)
    named = [(p, source if len(parts) == 1 else p) for p in parts]
    reader = _compiled_reader()
    items = [_row_items(p, s, reader, key, columns=len(named) == 1) for p, s in named]
    if None in items:  # integers float64 cannot hold (or a collision of the NumPy reader's key hashes)
        hist = from_records([row for p, s in named for row in _rows_of(p, s)], source, "wandb", key)
    else:
        hist = from_row_items(joined_row_items(items), source, "wandb", key)
    hist.run = run
    if len(parts) > 1:
        hist.notes.append(f"{source}: run {run.label()} was resumed: its {len(parts)} logs are read in order")
    return hist


def read_wandb_file(path: str, key: str | None, source: str, run: str | None) -> Any:
    """A W&B run log given as a file (or on standard input): its run, named from its run record and file
    name, is the history's ``run`` (``run``, when given, must name it)."""
    rid, name, started = run_header(path)
    m = re.fullmatch(r"run-(\w+)\.wandb", os.path.basename(source))
    rid = m.group(1) if m else rid
    if rid is None and name is None:
        if run is not None:
            choose_run([], run, source, "W&B runs it can name")
        return read_wandb_log(path, key, source)
    this = Run(rid or name or "", name or rid or "", started, path)
    return read_wandb_log(path, key, source, choose_run([this], run, source, "W&B runs"))


def is_run_store(path: str) -> bool:
    """True when directory ``path`` is a W&B run (holds its ``run-<id>.wandb``) or the ``wandb`` directory
    of runs: a run's ``files/`` may hold a saved model, which does not make it a directory of dumps."""
    if os.path.basename(os.path.normpath(path)) == "wandb":
        return True
    try:
        return any(n.startswith("run-") and n.endswith(".wandb") for n in os.listdir(path))
    except OSError:
        return False


def wandb_runs(path: str, depth: int = 2) -> list[Run]:
    """The W&B runs under ``path`` (itself, ``wandb/``, or a directory holding ``wandb/``): directories
    ``run-<date>_<time>-<id>`` (``offline-run-...``) that hold a ``run-<id>.wandb`` log. The
    ``latest-run`` link is not counted twice."""
    import calendar
    import time

    found: dict[str, list[tuple[float, Run]]] = {}  # run ID -> its logs (a resumed run has several)
    for d, _, names in walk(os.path.normpath(path), depth):  # links (latest-run) are not followed
        logs = sorted(n for n in names if n.startswith("run-") and n.endswith(".wandb"))
        if not logs:
            continue
        m = _RUN_DIR.search(os.path.basename(os.path.realpath(d)))
        started = None
        if m:
            try:
                started = calendar.timegm(time.strptime(m.group(1), "%Y%m%d_%H%M%S"))
            except ValueError:
                pass
        rid = m.group(2) if m else logs[0][len("run-"):-len(".wandb")]
        log = os.path.join(d, logs[-1])
        _, name, start = run_header(log)
        run = Run(rid, name or os.path.basename(os.path.realpath(d)), start or started, log)
        found.setdefault(rid, []).append((run.started or 0.0, run))
    runs = []
    for pieces in found.values():
        pieces.sort(key=lambda p: p[0])
        first = pieces[0][1]
        parts = tuple(r.where for _, r in pieces)
        runs.append(Run(first.id, first.name, first.started, first.where, parts if len(parts) > 1 else ()))
    return runs


def read_wandb_dir(path: str, key: str | None, run: str | None, runs: list[Run]) -> Any:
    """One of the W&B ``runs`` under ``path`` (``run`` chooses among several)."""
    chosen = choose_run(runs, run, path, "W&B runs")
    return read_wandb_log(chosen.where, key, source=path, run=chosen)
