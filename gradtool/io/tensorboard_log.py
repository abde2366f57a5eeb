"""TensorBoard event files as gradient-norm histories, read with the standard library and NumPy.

An event file (``events.out.tfevents.<time>.<host>...``, written by ``torch.utils.tensorboard``'s
``SummaryWriter``, Lightning's default logger, the Hugging Face Trainer, Megatron-LM) is a sequence of
TFRecords: a little-endian uint64 length, its masked CRC-32C, the data, the data's masked CRC-32C. Each
record is an ``Event`` protobuf (tensorboard's ``event.proto``): ``wall_time`` = 1 (double), ``step`` = 2
(int64) and one of ``file_version`` = 3, ``summary`` = 5, ``session_log`` = 7 (and others: graphs, run
metadata); a ``Summary`` holds repeated ``value`` = 1, each a ``tag`` = 1 and one of ``simple_value`` = 2
(a float32: what ``add_scalar`` writes) and other kinds (histograms, images, ``tensor`` = 8), and a
``metadata`` = 9 naming the plugin the value is for.

What TensorBoard's ``EventAccumulator`` keeps of a run's scalars is kept here (tested against it): each
tag's ``simple_value`` scalars in the order read, a run directory's event files in name order, and the
events a restart orphaned purged as it purges them. Scalars written as tensors (TensorFlow 2's
``tf.summary.scalar``, Keras' ``TensorBoard`` callback, ``add_scalar(..., new_style=True)``) are kept as
TensorBoard's scalars dashboard shows them (tested against its ``plugin_event_accumulator``): the
tensors of one number of each tag whose metadata (from its first value with metadata) names the plugin
``scalars``. TensorBoard reads records with a CRC-32C computed byte by byte in Python (~30 us an event);
here the CRCs of all records are computed together with NumPy, a byte position at a time across records;
the records of one scalar's event as ``add_scalar`` and ``tf.summary.scalar`` write them are found and
read together with NumPy too, and the other events by the protobuf field reader of
:mod:`~gradtool.io.protowire`. A record cut off at the end of a file (a run still writing, or
killed) ends it, as in TensorBoard; a damaged record before that is an InputError naming the byte, where
TensorBoard would stop reading the file there without a word.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from functools import cache
from typing import Any, NamedTuple, NoReturn

from ..errors import InputError
from .protowire import FIXED32, FIXED64, LENGTH_DELIMITED, VARINT, _tag_at, _varint

_EVENT_WHAT = frozenset((3, 4, 5, 6, 7, 8, 9))  # Event's oneof "what": file_version, graph_def, summary, ...
_FILE_VERSION, _SUMMARY, _SESSION_LOG = 3, 5, 7
_VALUE_KINDS = frozenset((3, 4, 5, 6, 8))  # Summary.Value's oneof "value" besides simple_value = 2: histo...
# Event's messages not read here, checked as protobuf parses them: log_message = 6 (its message = 2 a string),
# tagged_run_metadata = 8 (tag = 1), source_metadata = 10 (writer = 1)
_STRINGS_OF = {6: (2,), 8: (1,), 10: (1,)}
_TENSOR, _METADATA = 8, 9  # Summary.Value's tensor (a TensorProto) and metadata (a SummaryMetadata)
_SCALARS_PLUGIN = "scalars"
_SCALARS_METADATA = b"\x4a\x0b\x0a\x09\x0a\x07scalars"  # a value's metadata field: plugin_data's plugin_name
# TensorProto's dtype (types.proto's DataType) → (NumPy type, the field of its values as make_ndarray reads
# them): float = 1, double = 2, int32 = 3, uint8 = 4, int16 = 5, int8 = 6, int64 = 9, bfloat16 = 14,
# uint16 = 17, half = 19 (half_val = 13 holds the 16 bits of half and bfloat16 values)
_TENSOR_DTYPES = {1: ("<f4", 5), 2: ("<f8", 6), 3: ("<i4", 7), 4: ("<u1", 7), 5: ("<i2", 7), 6: ("<i1", 7),
                  9: ("<i8", 10), 14: ("<u2", 13), 17: ("<u2", 7), 19: ("<f2", 13)}
_BFLOAT16 = 14  # read as its 16 bits (NumPy has no bfloat16): the top half of a float32
_START = 1  # SessionLog.SessionStatus.START
_FLOAT = struct.Struct("<f")
_LONG_RECORD = 4096  # records longer than this have their CRC computed one by one
_CRC_BATCH = 1 << 16
_SAME_LENGTH_AT_LEAST = 8  # a batch of pieces of one length of this many or more: by _crc32c_as_first
WINDOW = 8 << 20  # bytes of an event file read at a time
_GUESS_AFTER = 16  # records read one by one before the next are guessed to repeat the last ones' lengths
_GUESS_RECORDS = 1 << 15  # records guessed and checked at a time, at most
_GUESS_FIRST = 64  # records guessed and checked at first, four times more each time all were as guessed
_TAGS_COMPARED = 1 << 16  # distinct tags of one length read together in a window; records of more, one by one


def is_event_file_name(name: str) -> bool:
    """True for the name of a TensorBoard event file (TensorBoard's ``IsSummaryEventsFile``)."""
    return "tfevents" in name and not name.endswith(".profile-empty")


def event_files(path: str) -> list[str]:
    """The event files to read for ``path``: itself when it is a file, else the event files directly in
    the directory ``path``, in name order (the order TensorBoard loads them in: a resumed run's later)."""
    if not os.path.isdir(path):
        return [path]
    return [os.path.join(path, n) for n in sorted(os.listdir(path))
            if is_event_file_name(n) and os.path.isfile(os.path.join(path, n))]


def scalar_series(path: str) -> dict[str, tuple[Any, Any]]:
    """Every tag's scalars of the run at ``path`` (an event file, or a directory of them) as arrays of
    steps (int64) and values (float64) in the order read, tags in the order first seen, after TensorBoard's
    purges: with ``file_version`` 2 or later (every writer since TensorFlow 1.0) a ``SessionLog.START``
    event at step s drops every scalar at step s or later; without it, an event with a summary whose step
    is before the latest step seen drops the scalars of its tags at its step or later. A tag's scalars are
    its ``simple_value`` values and, when its first value with metadata names the ``scalars`` plugin, its
    tensors of one number (``make_ndarray(tensor).item()``, widened to float64)."""
    import numpy as np

    series: dict[str, _Points] = {}
    state = _RunState()
    for f in event_files(path):
        for scalars, others in _events(f):
            at = 0  # the scalar records between two other events are added together
            for index, event in [*others, (None, None)]:
                end = scalars.size if index is None else int(np.searchsorted(scalars.index, index))
                if end > at:
                    scalars.add_to(series, state, at, end)
                    at = end
                if event is not None:
                    _add_event(series, state, *event)
    return {tag: points.arrays() for tag, points in series.items()
            if points.simple or state.plugins.get(tag) == _SCALARS_PLUGIN}


class _Points:
    """A tag's scalars as they are read: pieces of step and value arrays, and the points added one by one
    since the last piece (as lists); ``simple``: whether any was a ``simple_value`` (else they are all
    tensors', scalars only if the tag's plugin is ``scalars``)."""

    def __init__(self) -> None:
        self.pieces: list[tuple[Any, Any]] = []
        self.steps: list[int] = []
        self.values: list[float] = []
        self.simple = False

    def _close(self) -> None:
        import numpy as np

        if self.steps:
            self.pieces.append((np.array(self.steps, np.int64), np.array(self.values, np.float64)))
            self.steps, self.values = [], []

    def extend(self, steps: Any, values: Any, simple: bool = True) -> None:
        """Add scalars as arrays (``simple``: some of them ``simple_value`` ones)."""
        self._close()
        self.pieces.append((steps, values))
        self.simple |= simple

    def keep_before(self, step: int) -> None:
        self._close()
        self.pieces = [(s[s < step], v[s < step]) for s, v in self.pieces]

    def arrays(self) -> tuple[Any, Any]:
        import numpy as np

        self._close()
        if not self.pieces:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        return np.concatenate([s for s, _ in self.pieces]), np.concatenate([v for _, v in self.pieces])


def _add_event(series: dict[str, _Points], state: _RunState, step: int, kind: int, what: Any) -> None:
    """One event (see :func:`_event`): the purges it makes, then its scalars."""
    if kind != _SUMMARY or not state.by_session_log:  # (a summary can purge only by its step)
        state.apply(series, step, kind, what)
    if kind == _SUMMARY:
        for value in what:
            if value.plugin is not None and value.tag not in state.plugins:
                state.plugins[value.tag] = value.plugin
            if value.scalar is not None:
                if (points := series.get(value.tag)) is None:
                    points = series[value.tag] = _Points()
                points.steps.append(step)
                points.values.append(value.scalar)
                points.simple |= not value.tensor


class _RunState:
    """What TensorBoard keeps of a run's events read so far, carried from file to file of the run: the state
    its ``EventAccumulator`` keeps to find orphaned events (``purge_orphaned_data``), and each tag's plugin
    (from the tag's first value with metadata, as its ``plugin_event_accumulator`` keeps it)."""

    def __init__(self) -> None:
        self.file_version: float | None = None
        self.by_session_log = False  # file_version 2 or later: only SessionLog.START purges
        self.most_recent_step = -1
        self.plugins: dict[str, str] = {}

    def apply(self, series: dict[str, _Points], step: int, kind: int, what: Any) -> None:
        """Drop the scalars the event (``step``, oneof ``kind`` with ``what``: see :func:`_event`) orphans,
        before its own values are added (``EventAccumulator._MaybePurgeOrphanedData``)."""
        if kind == _FILE_VERSION:
            try:
                self.file_version = float(what.split("brain.Event:")[-1])
            except ValueError:
                self.file_version = -1.0
            self.by_session_log = bool(self.file_version and self.file_version >= 2)
        if self.by_session_log:
            if kind == _SESSION_LOG and what == _START:
                _drop_from(series, "", step)
        elif step < self.most_recent_step and kind == _SUMMARY:
            for value in what:
                _drop_from(series, value.tag, step)
        else:
            self.most_recent_step = step


def _drop_from(series: dict[str, _Points], tag: str, step: int) -> None:
    """Keep the scalars of ``tag`` logged before ``step`` (a tag emptied stays, as TensorBoard's does);
    the empty tag stands for every tag, as it does in TensorBoard's ``Reservoir.FilterItems``."""
    for t in (tag,) if tag else list(series):
        if t in series:
            series[t].keep_before(step)


def _events(path: str) -> Iterator[tuple[_ScalarRecords, list[tuple[int, tuple[int, int, Any]]]]]:
    """The events of the event file ``path``, read ``WINDOW`` bytes at a time (memory: a window and the
    longest record, whatever the file's size): for each window, its scalar records (see
    :class:`_ScalarRecords`) and its other events (record index, event as :func:`_event` reads it). The
    length of every record is checked against its CRC (a damaged length would misplace every record after
    it), the data of the events scalars are read from against theirs (see :func:`_checked_events`); a
    record cut off at the end of the file ends it."""
    try:
        with open(path, "rb") as f:
            buf, offset, eof = b"", 0, False  # offset: where in the file buf starts
            while True:
                starts, lengths, end, data_ok = _framing(buf, offset, path)
                if len(starts):
                    yield _checked_events(buf, starts, lengths, offset, path, data_ok)
                rest = buf[end:]
                if len(rest) >= 12 and not _length_is_intact(rest):
                    _bad_length(path, offset + end)
                need = 16 + struct.unpack_from("<Q", rest)[0] - len(rest) if len(rest) >= 12 else 0
                if eof or need > os.fstat(f.fileno()).st_size - f.tell():  # the file ends before it would
                    return
                chunk = f.read(max(WINDOW, need))
                eof = not chunk
                offset += end
                buf = rest + chunk
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _checked_events(buf: bytes, starts: Any, lengths: Any, offset: int, path: str,
                    data_ok: Any = None) -> tuple[_ScalarRecords, list[tuple[int, tuple[int, int, Any]]]]:
    """The events of the whole records at ``starts`` of ``buf`` (at byte ``offset`` of the file): the
    scalar records found by :func:`_scalar_records`, the others read one by one. Their lengths are checked
    against their CRCs, and the data of those that give scalars, file versions and session logs against
    theirs (not that of summaries without a scalar: images and histograms, up to megabytes each, whose
    CRC is computed in Python; only their steps and tags count, and only in logs older than
    ``file_version`` 2). ``data_ok``: whether each record's data matches its CRC, when the compiled
    framing computed it (which checked the lengths too); else both are computed here with NumPy."""
    import numpy as np

    raw = np.frombuffer(buf, np.uint8)
    at, size = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    if data_ok is None:
        length_crcs = _masked_crc32c(raw, at - 12, np.full(at.size, 8, np.int64))
        bad = np.flatnonzero(length_crcs != _u32_at(raw, at - 4))
        if bad.size:
            _bad_length(path, offset + int(at[bad[0]]) - 12)
    scalars = _scalar_records(raw, at, size)
    others = []
    for n in np.flatnonzero(~scalars.found).tolist():
        start, length = starts[n], lengths[n]
        try:
            others.append((n, _event(buf[start:start + length])))
        except ValueError as exc:  # UnicodeDecodeError included
            raise InputError(f"{path}: damaged TensorBoard event (record at byte {offset + start - 12}: "
                             f"{exc})") from None
    used = scalars.found.copy()  # (a summary of images or histograms alone, often long, is not checked)
    used[[n for n, (_, kind, what) in others if kind in (_FILE_VERSION, _SESSION_LOG) or (
        kind == _SUMMARY and any(value.scalar is not None for value in what))]] = True
    if data_ok is None:
        bad = np.flatnonzero(_masked_crc32c(raw, at[used], size[used]) != _u32_at(raw, (at + size)[used]))
    else:
        bad = np.flatnonzero(~data_ok[used])
    if bad.size:
        raise InputError(f"{path}: damaged TensorBoard event file (bad record at byte "
                         f"{offset + int(at[used][bad[0]]) - 12})")
    return scalars, others


class _ScalarRecords:
    """The records of a window laid out as writers write one scalar's event (``add_scalar``, TensorFlow
    2's ``tf.summary.scalar``: see :func:`_scalar_records_here`), read together: ``found`` marks them among
    the window's records; ``index`` (their record numbers), ``steps``, ``values`` (float32 widened),
    ``tags`` (numbers into ``names``) and ``kinds`` (0: a ``simple_value``; 1: a tensor of one float32;
    2: the same with metadata naming the plugin ``scalars``; None: all 0) describe them."""

    def __init__(self, found: Any, steps: Any, values: Any, tags: Any, names: list[str],
                 kinds: Any = None) -> None:
        import numpy as np

        self.found, self.index = found, np.flatnonzero(found)
        self.steps, self.values, self.tags, self.names = steps, values, tags, names
        self.kinds = kinds if kinds is not None and kinds.any() else None
        self.size = self.index.size

    def _value(self, i: int) -> _Value:
        kind = 0 if self.kinds is None else int(self.kinds[i])
        return _Value(self.names[self.tags[i]], float(self.values[i]), kind > 0,
                      _SCALARS_PLUGIN if kind == 2 else None)

    def add_to(self, series: dict[str, _Points], state: _RunState, a: int, b: int) -> None:
        """Add the scalars ``a:b`` (consecutive events of the file but for records of no event) to
        ``series``, as their events would be one by one: together, tag by tag in the order the tags first
        come, when no summary can purge (``file_version`` 2 or later); else one by one."""
        import numpy as np

        if not state.by_session_log:
            for i in range(a, b):
                _add_event(series, state, int(self.steps[i]), _SUMMARY, [self._value(i)])
            return
        tags = self.tags[a:b]
        steps, values = self.steps[a:b], self.values[a:b]
        kinds = None if self.kinds is None else self.kinds[a:b]
        distinct, first, which = np.unique(tags, return_index=True, return_inverse=True)
        grouped = np.argsort(which.ravel(), kind="stable")  # each tag's scalars together, in file order
        bounds = np.concatenate(([0], np.cumsum(np.bincount(which.ravel(), minlength=distinct.size))))
        for u in np.argsort(first).tolist():  # (a search of the window per tag: 2,000 tags, 0.75 s)
            t = int(distinct[u])
            sel = grouped[bounds[u]:bounds[u + 1]] if distinct.size > 1 else slice(None)
            points = series.setdefault(self.names[t], _Points())
            if kinds is None:
                points.extend(steps[sel], values[sel])
                continue
            points.extend(steps[sel], values[sel], simple=bool((kinds[sel] == 0).any()))
            if (kinds[sel] == 2).any():  # (a tag's first metadata counts: an earlier one stays)
                state.plugins.setdefault(self.names[t], _SCALARS_PLUGIN)


def _scalar_records(raw: Any, at: Any, size: Any) -> _ScalarRecords:
    """:func:`_scalar_records_here`, by the compiled log reader when it is built (``tfevent_scalars``: the
    same layout and TensorFlow 2's scalars, read record by record in C; a window with a tag that is not
    UTF-8 is left to the NumPy reader, which leaves those records to the one-by-one reader, where the error
    is said)."""
    frames = _compiled_frames()
    if frames is None:
        return _scalar_records_here(raw, at, size)
    import numpy as np

    from ._logscan import tfevent_scalars

    found, steps, values, tags, names, kinds = tfevent_scalars(raw, at, size)
    try:
        texts = [name.decode("utf-8") for name in names]
    except UnicodeDecodeError:  # the NumPy reader leaves those records to be read one by one (the error)
        return _scalar_records_here(raw, at, size)
    return _ScalarRecords(np.frombuffer(found, np.bool_), np.frombuffer(steps, np.int64),
                          np.frombuffer(values, np.float64), np.frombuffer(tags, np.int32).astype(np.int64),
                          texts, np.frombuffer(kinds, np.uint8))


def _scalar_records_here(raw: Any, at: Any, size: Any) -> _ScalarRecords:
    """The records (data at ``at``, ``size`` bytes, in the byte array ``raw``) that hold exactly one
    scalar's event as writers write it, found and read with NumPy: ``09 <wall_time> 10 <step: a varint of
    1-4 bytes> 2a L 0a V 0a K <tag: K bytes of UTF-8> <value>``, where ``<value>`` is
    ``SummaryWriter.add_scalar``'s ``15 <float32>`` (a ``simple_value``, kind 0) or a tensor of one float32
    as TensorFlow 2's ``tf.summary.scalar`` (``tensor_content``), ``add_scalar(new_style=True)`` and
    TensorBoard's ``make_tensor_proto`` (``float_val``) write it, ``42 T 08 01 [12 00] (22|2a) 04
    <float32>``, without metadata (kind 1) or with the ``scalars`` plugin's (kind 2: ``4a M 0a 09 0a 07
    "scalars" [20 01]``); each length a byte < 128 and each field ending the message it is in. Protobuf
    reads such a record as an ``Event`` of that step holding one ``Summary`` of one value of that tag."""
    import numpy as np

    last = raw.size - 1

    def byte(where: Any) -> Any:
        return raw[np.minimum(where, last)].astype(np.int64)

    c = [byte(at + 10 + k) for k in range(4)]  # the step's varint
    width = np.where(c[0] < 128, 1, np.where(c[1] < 128, 2, np.where(c[2] < 128, 3,
                                                                    np.where(c[3] < 128, 4, 0))))
    steps = c[0] & 127
    for k in (1, 2, 3):
        steps = steps + np.where(width > k, (c[k] & 127) << (7 * k), 0)
    p = at + 10 + width
    outer, value, k = byte(p + 1), byte(p + 3), byte(p + 5)
    found = ((size >= 22) & (byte(at) == 0x09) & (byte(at + 9) == 0x10) & (width > 0) & (byte(p) == 0x2A)
             & (outer < 128) & (p + 2 + outer == at + size) & (byte(p + 2) == 0x0A) & (value == outer - 2)
             & (byte(p + 4) == 0x0A) & (k <= value - 4))
    v, n = p + 6 + k, value - 2 - k  # the value's fields after its tag
    simple = found & (n == 5) & (byte(v) == 0x15)
    t = byte(v + 1)  # a tensor's length: 8, or 10 with an empty shape
    q = v + np.where(t == 10, 6, 4)  # where its one value's field is
    rest = n - 2 - t  # the metadata's bytes
    meta = rest == 13
    for i, b in enumerate(_SCALARS_METADATA):
        meta &= byte(v + 2 + t + i) == b
    with_class = rest == 15
    for i, b in enumerate(b"\x4a\x0d" + _SCALARS_METADATA[2:] + b"\x20\x01"):
        with_class &= byte(v + 2 + t + i) == b
    tensor = (found & (n >= 10) & (byte(v) == 0x42) & ((t == 8) | ((t == 10) & (byte(v + 4) == 0x12)
                                                                   & (byte(v + 5) == 0)))
              & (byte(v + 2) == 0x08) & (byte(v + 3) == 0x01) & ((byte(q) == 0x22) | (byte(q) == 0x2A))
              & (byte(q + 1) == 0x04) & ((rest == 0) | meta | with_class))
    found = simple | tensor
    kinds = np.where(simple, 0, np.where(rest == 0, 1, 2)).astype(np.uint8)
    tags = np.zeros(at.size, np.int64)
    names: list[str] = []
    for width_k in np.unique(k[found]).tolist():  # the tags, by their length
        rows = np.flatnonzero(found & (k == width_k))
        text = raw[(p[rows] + 6)[:, None] + np.arange(width_k)]
        # the distinct tags (rows of bytes sorted as one void value each), in the order they first come: a
        # run of each parameter's norm logs hundreds of tags of one length (they were compared one at a
        # time, up to 64, the others' records read one by one: 200 parameters over 5,000 steps, 9 -> 2 s)
        if width_k:
            _, first, which = np.unique(text.view(np.dtype((np.void, width_k))).ravel(), return_index=True,
                                        return_inverse=True)
        else:
            first, which = np.zeros(1, np.int64), np.zeros(rows.size, np.int64)
        code = np.full(first.size, -1, np.int64)  # each distinct tag's number in names; -1: one by one
        order = np.argsort(first)
        for u in order[:_TAGS_COMPARED].tolist():
            try:
                names.append(text[first[u]].tobytes().decode("utf-8"))
                code[u] = len(names) - 1
            except UnicodeDecodeError:  # read one by one: the error is said there
                pass
        tags[rows] = code[which.ravel()]
        found[rows[tags[rows] < 0]] = False  # (more distinct tags of this length than _TAGS_COMPARED, too)
    where = np.where(simple, v + 1, q + 2)[found]
    with np.errstate(invalid="ignore"):  # a signalling NaN made quiet (as struct makes it), no warning
        values = raw[where[:, None] + np.arange(4)].copy().view("<f4").ravel().astype(np.float64)
    return _ScalarRecords(found, steps[found], values, tags[found], names, kinds[found])


def _u32_at(raw: Any, where: Any) -> Any:
    """The little-endian uint32 (a stored CRC) at each offset ``where`` of the byte array ``raw``."""
    import numpy as np

    return raw[where[:, None] + np.arange(4)].copy().view("<u4").ravel()


def _length_is_intact(record: bytes) -> bool:
    """True when the length field of the record that ``record`` starts with matches its CRC."""
    import numpy as np

    raw = np.frombuffer(record[:12], np.uint8)
    crc = _masked_crc32c(raw, np.zeros(1, np.int64), np.full(1, 8, np.int64))
    return int(crc[0]) == struct.unpack_from("<I", record, 8)[0]


def _bad_length(path: str, at: int) -> NoReturn:
    raise InputError(f"{path}: damaged TensorBoard event file (bad record length at byte {at})")


def _compiled_frames() -> Any:
    """The compiled ``tfrecord_frames`` (gradtool/io/_logscan.c), or None (see
    :mod:`~gradtool.io.compiled`); its ``tfevent_scalars`` goes with it."""
    from .compiled import log_readers

    readers = log_readers()
    return None if readers is None else readers.tfrecord_frames


def _framing(data: bytes, offset: int = 0, path: str = "") -> tuple[Any, Any, int, Any]:
    """Where each whole record's data starts in ``data``, its length, where the records end (a record cut
    off there is left out), and whether each record's data matches its CRC or None. By the compiled
    framing when built (lengths checked against their CRCs there: the first that does not match is an
    InputError naming byte ``offset`` + its place; data CRCs computed; arrays); else :func:`_framing_here`
    (lists, lengths not yet checked, data CRCs left to :func:`_checked_events`)."""
    frames = _compiled_frames()
    if frames is None:
        return (*_framing_here(data), None)
    import numpy as np

    starts, lengths, end, bad, ok = frames(data)
    if bad >= 0:
        _bad_length(path, offset + bad)
    return (np.frombuffer(starts, np.int64), np.frombuffer(lengths, np.int64), end,
            np.frombuffer(ok, np.bool_))


def _framing_here(data: bytes) -> tuple[list[int], list[int], int]:
    """:func:`_framing` in Python and NumPy, the lengths not yet checked: record by record; when the
    last lengths repeat with a short period (a writer logging the same tags step after step), the next
    records are guessed to go on so and checked together (:func:`_records_as_before`)."""
    starts: list[int] = []
    lengths: list[int] = []
    pos, n = 0, len(data)
    unpack = struct.Struct("<Q").unpack_from
    while pos + 12 <= n:
        (length,) = unpack(data, pos)
        end = pos + 12 + length
        if end + 4 > n:
            break
        starts.append(pos + 12)
        lengths.append(length)
        pos = end + 4
        if len(lengths) % _GUESS_AFTER == 0:
            pos = _records_as_before(data, pos, starts, lengths)
    return starts, lengths, pos


def _records_as_before(data: bytes, pos: int, starts: list[int], lengths: list[int]) -> int:
    """Frame the records from ``pos`` on as repeating the period of the last lengths (of 1 to 8 records),
    as long as each record's length field says so; their starts and lengths appended. Where the record
    after those starts. Exact: a record is taken only when its length field, where the records before
    put it, holds the length guessed, which is what reading them one by one finds. ``_GUESS_FIRST`` records
    are guessed first, then four times more while all were as guessed: a guess that fails at once (tags
    of one length among others, each parameter's norm) costs a few records, not ``_GUESS_RECORDS`` (200
    parameters' norms over 5,000 steps without the compiled reader: 42 -> 10 s)."""
    import numpy as np

    last = lengths[-_GUESS_AFTER:]
    period = next((q for q in range(1, 9) if last[q:] == last[:-q]), 0)
    if not period:
        return pos
    cycle = np.asarray(lengths[-period:], np.int64)
    raw = np.frombuffer(data, np.uint8)
    guess = _GUESS_FIRST
    while True:
        count = min(guess, _GUESS_RECORDS, (len(data) - pos) // int(cycle.min() + 16))
        guess *= 4
        if count < 1:
            return pos
        size = np.resize(cycle, count)
        at = pos + np.concatenate(([0], np.cumsum(size[:-1] + 16)))
        ok = at + size + 16 <= len(data)
        field = raw[np.minimum(at, len(data) - 8)[:, None] + np.arange(8)].copy().view("<u8").ravel()
        ok &= field == size.astype(np.uint64)
        took = count if ok.all() else int(np.argmin(ok))
        starts.extend((at[:took] + 12).tolist())
        lengths.extend(size[:took].tolist())
        if took:
            pos = int(at[took - 1] + size[took - 1] + 16)
            cycle = np.roll(cycle, -took)
        if took < count:
            return pos


def _event(buf: bytes) -> tuple[int, int, Any]:
    """(step, the field number of the member of the oneof ``what`` the ``Event`` message ``buf`` holds or
    0, that member): a summary as its values (see :func:`_summary_values`), a session log as its status,
    a file version as its text, others as their bytes. Read as protobuf parses it: the last value of a
    scalar field wins, a field of another wire type than the schema's is an unknown field, a message given
    twice is merged (parsing the pieces concatenated), a oneof holds the member given last, a string must
    be UTF-8. ValueError (UnicodeDecodeError) on malformed data."""
    n = len(buf)
    if n > 12 and buf[0] == 0x09 and buf[9] == 0x10:  # wall_time, step, and then a summary to the end?
        step, i = _varint(buf, 10)  # (as writers lay out a scalar's event)
        if step < 1 << 63 and i < n and buf[i] == 0x2A:
            size, j = _varint(buf, i + 1)
            if j + size == n:
                return step, _SUMMARY, _summary_values(buf[j:])
    step, kind, parts = 0, 0, []
    i = 0
    while i < n:
        t, v, i = _tag_at(buf, i, n)
        f = t >> 3
        if t == 2 << 3 | VARINT:
            step = _signed(v, 64)  # int64
        elif f in _EVENT_WHAT and t & 7 == LENGTH_DELIMITED:
            if f in _STRINGS_OF:
                _check_message(v, _STRINGS_OF[f])
            if f == kind and f in (_SUMMARY, _SESSION_LOG, 6, 8):  # a message member given again: merged
                parts.append(v)
            else:
                kind, parts = f, [v]
        elif f in _STRINGS_OF and t & 7 == LENGTH_DELIMITED:
            _check_message(v, _STRINGS_OF[f])
    what = b"".join(parts)
    if kind == _SUMMARY:
        return step, kind, _summary_values(what)
    if kind == _SESSION_LOG:
        return step, kind, _session_status(what)
    if kind == _FILE_VERSION:
        return step, kind, what.decode("utf-8")
    return step, kind, what


class _Value(NamedTuple):
    """A ``Summary.Value`` as read: its tag, its scalar (a ``simple_value``, or a tensor's one number when
    ``tensor``; None for a value of another kind, or a tensor of no number or of several), and the
    ``plugin_name`` of its metadata (None without metadata)."""

    tag: str
    scalar: float | None
    tensor: bool = False
    plugin: str | None = None


def _check_message(buf: bytes, strings: tuple[int, ...]) -> None:
    """ValueError where protobuf would refuse the message ``buf`` of an Event's that is not read here: a
    malformed field, or a string field (numbers ``strings``) not UTF-8."""
    i, n = 0, len(buf)
    while i < n:
        t, v, i = _tag_at(buf, i, n)
        if t & 7 == LENGTH_DELIMITED and t >> 3 in strings:
            v.decode("utf-8")


def _summary_values(summary: bytes) -> list[_Value]:
    """The values of a ``Summary`` (see :class:`_Value`). A value's fields are read as protobuf parses
    them: the oneof's last member wins, a message given twice is merged (its pieces parsed concatenated)."""
    out = []
    i, n = 0, len(summary)
    while i < n:
        if summary[i] == 0x0A and i + 3 < n and (size := summary[i + 1]) < 0x80 and summary[i + 2] == 0x0A \
                and (k := summary[i + 3]) == size - 7 and i + 2 + size <= n and summary[i + 4 + k] == 0x15:
            # a value laid out as writers write a scalar's: 0a L 0a K <tag> 15 <float32>, L and K < 128
            out.append(_Value(summary[i + 4:i + 4 + k].decode("utf-8"),
                              _FLOAT.unpack_from(summary, i + 5 + k)[0]))
            i += 2 + size
            continue
        t, v, i = _tag_at(summary, i, n)
        if t != 1 << 3 | LENGTH_DELIMITED:
            continue
        tag, scalar, kind = b"", None, 0  # kind: the field number of the oneof's member (2: simple_value)
        member: list[bytes] = []  # its pieces
        metadata: list[bytes] | None = None
        j, m = 0, len(v)
        while j < m:
            u, w, j = _tag_at(v, j, m)
            if u == 1 << 3 | LENGTH_DELIMITED:
                tag = w
            elif u == 2 << 3 | FIXED32:
                scalar, kind = w, 2
            elif u == _METADATA << 3 | LENGTH_DELIMITED:
                metadata = [*(metadata or ()), w]
            elif u >> 3 in _VALUE_KINDS and u & 7 == LENGTH_DELIMITED:  # another kind: the oneof's now
                member = [*member, w] if kind == u >> 3 else [w]
                kind = u >> 3
        plugin = None if metadata is None else _plugin_name(b"".join(metadata))
        if kind == _TENSOR:
            out.append(_Value(tag.decode("utf-8"), _tensor_scalar(b"".join(member)), True, plugin))
        else:
            out.append(_Value(tag.decode("utf-8"), None if kind != 2 else _FLOAT.unpack(scalar)[0],
                              False, plugin))
    return out


def _plugin_name(metadata: bytes) -> str:
    """``SummaryMetadata.plugin_data.plugin_name`` (fields 1 and 1; "" when absent), or "" when its
    ``data_class`` (field 4) is another than unknown (0) or scalar (1): TensorBoard's scalars dashboard
    shows a tag of the plugin ``scalars`` only of those classes."""
    plugin_data = []
    data_class = 0
    i, n = 0, len(metadata)
    while i < n:
        t, v, i = _tag_at(metadata, i, n)
        if t == 1 << 3 | LENGTH_DELIMITED:
            plugin_data.append(v)
        elif t == 4 << 3 | VARINT:
            data_class = v & 0xFFFFFFFF  # an enum: int32
    if data_class not in (0, 1):
        return ""
    data, name = b"".join(plugin_data), b""
    i, n = 0, len(data)
    while i < n:
        t, v, i = _tag_at(data, i, n)
        if t == 1 << 3 | LENGTH_DELIMITED:
            name = v
    return name.decode("utf-8")


def _tensor_scalar(tensor: bytes) -> float | None:
    """The one number of a ``TensorProto`` as TensorBoard's ``make_ndarray(tensor).item()`` reads it, as a
    float; None when it holds no number or several, or is of a type other than the real ones of
    ``_TENSOR_DTYPES``. Fields: ``dtype`` = 1, ``tensor_shape`` = 2 (``dim`` = 2, each a ``size`` = 1),
    ``tensor_content`` = 4 (the values' bytes, little-endian), or the values in the field of the dtype
    (packed or not): ``float_val`` = 5, ``double_val`` = 6, ``int_val`` = 7, ``int64_val`` = 10,
    ``half_val`` = 13. One value given for a tensor of one element is its element."""
    import numpy as np

    dtype, content = 0, b""
    shape: list[bytes] = []
    vals: dict[int, list[Any]] = {}
    i, n = 0, len(tensor)
    while i < n:
        t, v, i = _tag_at(tensor, i, n)
        f, wire = t >> 3, t & 7
        if t == 1 << 3 | VARINT:
            dtype = v & 0xFFFFFFFF
        elif t == 2 << 3 | LENGTH_DELIMITED:
            shape.append(v)
        elif t == 4 << 3 | LENGTH_DELIMITED:
            content = v
        elif f in (5, 6, 7, 10, 13):
            vals.setdefault(f, []).append((wire, v))
    if dtype not in _TENSOR_DTYPES:
        return None
    elements = 1
    for size in _dim_sizes(b"".join(shape)):
        elements *= size
    if elements != 1:
        return None
    name, field = _TENSOR_DTYPES[dtype]
    np_type = np.dtype(name)
    if content:
        if len(content) != np_type.itemsize:
            return None
        raw = np.frombuffer(content, np_type)
    else:
        numbers = _repeated(field, vals.get(field, []))
        if len(numbers) != 1:
            return None
        if field in (5, 6):
            raw = np.array(numbers, np_type)
        elif field == 13:  # the 16 bits of a half or bfloat16
            raw = np.array([numbers[0] & 0xFFFF], np.uint16).view(np_type)
        else:  # an int32 or int64 field: the varint's low bits, two's complement, cast as make_ndarray does
            raw = np.array([_signed(numbers[0], 64 if field == 10 else 32)], np.int64).astype(np_type)
    if dtype == _BFLOAT16:
        return float((raw.astype(np.uint32) << 16).view(np.float32)[0])
    return float(raw[0])


def _repeated(field: int, pieces: list[tuple[int, Any]]) -> list[Any]:
    """The values of the repeated numeric field ``field`` of a ``TensorProto`` from its ``(wire type,
    value)`` pieces, packed or not: floats for ``float_val`` (5) and ``double_val`` (6), ints otherwise."""
    out: list[Any] = []
    fmt = "<f" if field == 5 else "<d" if field == 6 else None
    for wire, v in pieces:
        if fmt is not None:
            width = struct.calcsize(fmt)
            if wire == LENGTH_DELIMITED:
                if len(v) % width:
                    raise ValueError("packed field of a partial value")
                out.extend(x for (x,) in struct.iter_unpack(fmt, v))
            elif wire == (FIXED32 if width == 4 else FIXED64):
                out.append(struct.unpack(fmt, v)[0])
        elif wire == LENGTH_DELIMITED:
            j = 0
            while j < len(v):
                x, j = _varint(v, j)
                out.append(x)
        elif wire == VARINT:
            out.append(v)
    return out


def _signed(v: int, bits: int) -> int:
    """A varint's value as a protobuf field of ``bits``-bit signed integers reads it: its low bits, two's
    complement (int32, int64)."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _dim_sizes(shape: bytes) -> list[int]:
    """The ``size`` (int64) of each ``dim`` of a ``TensorShapeProto``."""
    sizes = []
    i, n = 0, len(shape)
    while i < n:
        t, v, i = _tag_at(shape, i, n)
        if t == 2 << 3 | LENGTH_DELIMITED:
            size, j, m = 0, 0, len(v)
            while j < m:
                u, w, j = _tag_at(v, j, m)
                if u == 1 << 3 | VARINT:
                    size = _signed(w, 64)
            sizes.append(size)
    return sizes


def _session_status(session_log: bytes) -> int:
    """``SessionLog.status`` (field 1, an enum: 0 when absent)."""
    status, i, n = 0, 0, len(session_log)
    while i < n:
        t, v, i = _tag_at(session_log, i, n)
        if t == 1 << 3 | VARINT:
            status = v & 0xFFFFFFFF  # an enum: int32
    return status


@cache
def _crc32c_table() -> Any:
    """The byte table of CRC-32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    import numpy as np

    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0x82F63B78), t >> 1).astype(np.uint32)
    return t


def _masked_crc32c(raw: Any, starts: Any, lengths: Any) -> Any:
    """The masked CRC-32C (TFRecord's: the CRC rotated right by 15 bits plus 0xA282EAD8) of each piece
    ``raw[start:start + length]`` of the byte array ``raw``. The pieces are taken shortest first,
    ``_CRC_BATCH`` at a time; a batch of pieces of one length by :func:`_crc32c_as_first`, others by
    advancing their CRCs together one byte position after another (a piece shorter than the position
    keeps its CRC); pieces longer than ``_LONG_RECORD`` one by one."""
    import numpy as np

    table = _crc32c_table()
    crc = np.full(len(starts), 0xFFFFFFFF, np.uint32)
    order = np.argsort(lengths, kind="stable")
    short = order[lengths[order] <= _LONG_RECORD]
    groups = np.split(short, np.flatnonzero(np.diff(lengths[short])) + 1) if short.size else []
    for rows in (g for g in groups if g.size >= _SAME_LENGTH_AT_LEAST):  # pieces of one length
        for b in range(0, rows.size, _CRC_BATCH):
            crc[rows[b:b + _CRC_BATCH]] = _crc32c_as_first(raw, starts[rows[b:b + _CRC_BATCH]],
                                                           int(lengths[rows[0]]), table)
    mixed = [g for g in groups if g.size < _SAME_LENGTH_AT_LEAST]
    mixed_rows = np.concatenate(mixed) if mixed else short[:0]
    for b in range(0, len(mixed_rows), _CRC_BATCH):
        rows = mixed_rows[b:b + _CRC_BATCH]
        at, size, c = starts[rows], lengths[rows], crc[rows]
        for j in range(int(size[-1]) if len(rows) else 0):
            k = int(np.searchsorted(size, j, side="right"))  # the rows at least j + 1 bytes long
            c[k:] = table[(c[k:] ^ raw[at[k:] + j]) & 0xFF] ^ (c[k:] >> 8)
        crc[rows] = c
    for r in order[lengths[order] > _LONG_RECORD].tolist():
        crc[r] = _crc32c_one(raw[starts[r]:starts[r] + lengths[r]].tobytes(), table)
    crc ^= np.uint32(0xFFFFFFFF)
    return ((crc >> 15) | (crc << 17)) + np.uint32(0xA282EAD8)


def _crc32c_as_first(raw: Any, at: Any, n: int, table: Any) -> Any:
    """The CRC-32C registers (not yet inverted) of the pieces of ``n`` bytes at ``at`` of ``raw``, from the
    first piece's: a CRC is affine over GF(2), so for pieces of one length crc(x) = crc(first) xor the
    CRC, from a zero register, of x xor first, which is the xor over the bytes where they differ of each
    one's contribution (:func:`_crc32c_by_position`). Records a writer writes for one tag differ in a few
    bytes (time, step, value): a few table lookups each instead of one per byte."""
    import numpy as np

    pieces = raw[at[:, None] + np.arange(n)]
    first = pieces[0]
    out = np.full(at.size, _crc32c_one(first.tobytes(), table), np.uint32)
    if n:
        by_position = _crc32c_by_position(n)
        for j in np.flatnonzero((pieces != first).any(axis=0)).tolist():
            out ^= by_position[j][raw[at + j] ^ first[j]]
    return out


@cache
def _crc32c_by_position(n: int) -> Any:
    """For pieces of ``n`` bytes, row j: the CRC-32C register (from zero, no inversion) of the piece of
    zeros but for byte value b at position j, for each b: that byte's CRC then n - 1 - j zero bytes."""
    import numpy as np

    table = _crc32c_table()
    rows = np.empty((n, 256), np.uint32)
    rows[n - 1] = table
    for j in range(n - 2, -1, -1):
        rows[j] = table[rows[j + 1] & 0xFF] ^ (rows[j + 1] >> 8)
    return rows


def _crc32c_one(data: bytes, table: Any) -> int:
    """The CRC-32C register after ``data`` (started at 0xFFFFFFFF, not yet inverted), byte by byte."""
    t = table.tolist()
    c = 0xFFFFFFFF
    for byte in data:
        c = t[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c
