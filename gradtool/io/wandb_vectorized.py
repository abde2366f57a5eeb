"""W&B run-log history rows read with NumPy, every record of a 16 MiB chunk at once: the reader of an
install without the compiled one (``wandb_block`` in gradtool/io/_logscan.c), giving the same rows as the
Python reader (:func:`~gradtool.io.wandb_log.history_rows`; property-tested in
tests/suggest/test_wandb_vectorized.py and tests/wandb_logs.py): 10^6 records of eight values 14.1 s,
1.2 GB -> 6.2 s, 375 MB (the compiled reader: 0.85 s).

Each step works on all the records (or items) of a chunk together, the k-th of each at the k-th NumPy
step, as far as they are laid out as wandb writes them:

1. framing (:func:`frame_records`): each 32 KiB block's records ``[crc32 u32][length u16][type u8][data]``,
   the blocks followed side by side; each record's CRC-32 checked by zlib; records split over blocks
   (FIRST/MIDDLE/LAST) joined in Python (:class:`_Joiner`), as :func:`~gradtool.io.wandb_log.log_records`
   does, with its errors;
2. records (:func:`record_histories`): the Record's fields (:func:`fields_at`) up to its first
   length-delimited field 2, the HistoryRecord;
3. items (:func:`history_items`): ``0a L 0a K <key> 82 01 V <value_json>`` (every length one byte), the
   step ``12 L 08 <varint>`` (given as the item ``_step``) and other fields (skipped);
4. keys (:class:`_Keys`): hashed (:func:`key_hashes`), then each item's key bytes compared with those of
   the key of its hash;
5. values (:func:`number_values`): classified by a few operations on their bytes as columns, integers
   summed by a matrix product (:func:`parse_integers`), other numbers parsed by NumPy's text parser
   (:func:`parse_numbers`: ``np.fromstring``, whose numbers are Python's own ``float()`` parser's).

A record any step cannot read so (another layout, a length of two bytes, a malformed field) is read by
:func:`~gradtool.io.wandb_log.history_rows`, a value (``NaN``, ``Infinity``, ``1_0``, an integer of more
than 15 digits) by :func:`~gradtool.io.wandb_log._number`: stricter here is only slower, never different.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import numpy as np

from ..errors import InputError

BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4
CHUNK_BLOCKS = 512  # 16 MiB of the log a step
_PAD = 512  # zeros after a chunk: every gather at an item (at most 4 + 255 + 3 bytes on) stays in the buffer
_MAX_INT_DIGITS = 15  # an integer of more digits may be beyond 2^53 (Python reads it: see _Rows.exact)

# record statuses (record_histories, history_items)
NOT_HISTORY, HISTORY, TO_PYTHON = 0, 1, 2


def frame_records(buf: np.ndarray, n: int, first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The records of the blocks ``buf[:n]`` (whole 32 KiB blocks, the last one maybe shorter), read from
    byte ``first`` of the first block: (positions of their headers, data lengths, types) in file order, and
    the position of the first record that runs past its block or has no known type (-1: none). Each block's
    records follow one another until fewer than 7 bytes are left or the header is zeros (the rest unused),
    as in :func:`~gradtool.io.wandb_log.log_records`; the blocks are followed together, one record of each
    a step. CRCs are not checked here."""
    starts = np.arange(0, n, BLOCK, dtype=np.int64)
    ends = np.minimum(starts + BLOCK, n)
    at = starts.copy()
    if len(at):
        at[0] = first
    live = np.arange(len(starts))
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    bad = -1
    while len(live):
        p = at[live]
        room = p + _HEADER <= ends[live]
        live, p = live[room], p[room]
        if not len(live):
            break
        length = buf[p + 4].astype(np.int64) | buf[p + 5].astype(np.int64) << 8
        kind = buf[p + 6]
        zeros = (kind == 0) & (length == 0) & ((buf[p] | buf[p + 1] | buf[p + 2] | buf[p + 3]) == 0)
        broken = ~zeros & ((p + _HEADER + length > ends[live]) | (kind < _FULL) | (kind > _LAST))
        if broken.any():
            first_broken = int(p[broken].min())
            bad = first_broken if bad < 0 else min(bad, first_broken)
        ok = ~zeros & ~broken
        live, p, length, kind = live[ok], p[ok], length[ok], kind[ok]
        found.append((p, length, kind))
        at[live] = p + _HEADER + length
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0, dtype=np.uint8), bad
    pos = np.concatenate([f[0] for f in found])
    order = np.argsort(pos, kind="stable")
    return (pos[order], np.concatenate([f[1] for f in found])[order],
            np.concatenate([f[2] for f in found])[order], bad)


def crc_mismatch(data: bytes | memoryview, pos: np.ndarray, length: np.ndarray, crc: np.ndarray) -> int:
    """The index of the first record whose CRC-32 (zlib's, of its type byte and data: the bytes after the
    CRC and length) is not ``crc``; -1 when all match."""
    view = memoryview(data)
    got = np.fromiter(map(zlib.crc32, map(view.__getitem__, map(slice, (pos + 6).tolist(),
                                                                 (pos + _HEADER + length).tolist()))),
                      dtype=np.uint32, count=len(pos))
    wrong = np.flatnonzero(got != crc)
    return int(wrong[0]) if len(wrong) else -1


class _Joiner:
    """Records split over blocks joined as :func:`~gradtool.io.wandb_log.log_records` joins them: a FIRST
    part starts one, MIDDLE and LAST parts continue it (a LAST ends it), a whole (FULL) record between
    drops it, and so does growing past ``max_record`` bytes. Carried from one chunk to the next."""

    def __init__(self, max_record: int):
        self.pieces: list[bytes] = []
        self.held = 0
        self.max_record = max_record

    def join(self, data: memoryview, pos: np.ndarray, length: np.ndarray,
             kind: np.ndarray) -> tuple[list[int], list[bytes]]:
        """The records ended in these (in file order): the index of each one's LAST part and its bytes."""
        full = kind == _FULL
        parts = np.flatnonzero(~full)
        ends: list[int] = []
        joined: list[bytes] = []
        fulls = np.cumsum(full)
        before = 0
        for i, k, p, n in zip(parts.tolist(), kind[parts].tolist(), pos[parts].tolist(),
                              length[parts].tolist()):
            if fulls[i] != before:  # a whole record since the last part
                self.pieces, self.held = [], 0
            before = int(fulls[i])
            piece = bytes(data[p + _HEADER:p + _HEADER + n])
            if k == _FIRST:
                self.pieces, self.held = [piece], n
            elif self.pieces:
                self.held += n
                self.pieces.append(piece)
                if self.held > self.max_record:
                    self.pieces, self.held = [], 0
                elif k == _LAST:
                    ends.append(i)
                    joined.append(b"".join(self.pieces))
                    self.pieces, self.held = [], 0
        if len(full) and fulls[-1] != before:
            self.pieces, self.held = [], 0
        return ends, joined


def _varint_ends(buf: np.ndarray, p: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray]:
    """(where the varint at each ``p`` ends, whether it ends within ``most`` bytes)."""
    window = np.lib.stride_tricks.sliding_window_view(buf, most)[p]
    last = window < 0x80
    return p + 1 + last.argmax(axis=1), last.any(axis=1)


def _varint_values(buf: np.ndarray, p: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, end, whether it ends within ``most`` bytes) of the varint at each ``p``; ``most`` ≤ 9, so
    that the value fits in an int64."""
    window = np.lib.stride_tricks.sliding_window_view(buf, most)[p].astype(np.int64)
    last = window < 0x80
    size = last.argmax(axis=1) + 1
    used = np.arange(most) < size[:, None]
    value = ((window & 0x7F) * used << (7 * np.arange(most, dtype=np.int64))).sum(axis=1)
    return value, p + size, last.any(axis=1)


def fields_at(buf: np.ndarray, p: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, ...]:
    """The protobuf field at each ``p`` of a message ending at ``e``: (its tag, where its value starts and
    ends, and whether it is one Python's field reader would not read so: a tag of more than two bytes or
    below 8, a varint of more than 10 bytes, a length of more than 4, a group, a value past ``e``)."""
    t0, t1 = buf[p].astype(np.int64), buf[p + 1].astype(np.int64)
    short = t0 < 0x80
    tag = np.where(short, t0, (t0 & 0x7F) | t1 << 7)
    data_at = p + np.where(short, 1, 2)
    odd = (~short & (t1 >= 0x80)) | (tag < 8)
    wire = tag & 7
    value_end = data_at.copy()
    is_varint = wire == 0
    if is_varint.any():
        v_end, v_ok = _varint_ends(buf, data_at[is_varint], 10)
        value_end[is_varint] = v_end
        odd[is_varint] |= ~v_ok
    value_end[wire == 1] += 8
    value_end[wire == 5] += 4
    delimited = wire == 2
    if delimited.any():
        length, at, l_ok = _varint_values(buf, data_at[delimited], 4)
        data_at[delimited] = at
        value_end[delimited] = at + length
        odd[delimited] |= ~l_ok
    odd |= (wire == 3) | (wire == 4) | (wire > 5) | (value_end > e)
    return tag, data_at, value_end, odd


def record_histories(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each Record ``buf[start:end]``'s first length-delimited field 2 (``Record.history``): (status,
    start, end of the HistoryRecord). Its fields before it are read (:func:`fields_at`) together for all
    records, one field a step; status NOT_HISTORY when there is no field 2 of wire type 2, TO_PYTHON for
    anything else (a malformed or unusual field, a fixed-width field 2):
    :func:`~gradtool.io.wandb_log.history_rows` reads those."""
    n = len(start)
    status = np.full(n, NOT_HISTORY, dtype=np.int8)
    h_start = np.zeros(n, dtype=np.int64)
    h_end = np.zeros(n, dtype=np.int64)
    live = np.flatnonzero(start < end)
    p = start[live]
    while len(live):
        e = end[live]
        tag, data_at, value_end, odd = fields_at(buf, p, e)
        history = ~odd & (tag >> 3 == 2) & (tag & 7 != 0)
        odd |= history & (tag & 7 != 2)  # a fixed-width field 2: Python takes it as bytes
        history &= ~odd
        status[live[odd]] = TO_PYTHON
        status[live[history]] = HISTORY
        h_start[live[history]] = data_at[history]
        h_end[live[history]] = value_end[history]
        more = ~odd & ~history & (value_end < e)
        live, p = live[more], value_end[more]
    return status, h_start, h_end


class Items:
    """History items in record order (a record's in its order): the record, key bytes ``buf[key:key +
    key_len]`` (the step: ``key`` -1), value bytes ``buf[value:value + value_len]`` (the step: its number
    in ``step``)."""

    def __init__(self, record: np.ndarray, key: np.ndarray, key_len: np.ndarray, value: np.ndarray,
                 value_len: np.ndarray, step: np.ndarray):
        self.record, self.key, self.key_len = record, key, key_len
        self.value, self.value_len, self.step = value, value_len, step

    def __len__(self) -> int:
        return len(self.record)


FEW_RECORDS = 8  # records read side by side, fewer than which the rest of their items go to Python
LONG_HISTORY = 4096  # bytes of a HistoryRecord from which its items are first looked for by their bytes


def item_or_step(buf: np.ndarray, q: np.ndarray,
                 e: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What starts at each ``q`` of ``buf``: (whether an item ``0a L 0a K <key> 82 01 V <value>`` with L, K,
    V below 128 and ``L == K + V + 5``; the number of a step ``12 L 08 <varint>`` with L below 128 and the
    number, at most 2^53, inside it, else -1; where the field ends, ``q + 2 + L``), the field ending by
    ``e`` when given (the size byte is in the history too). Every gather stays in the buffer: _PAD."""
    b0, size = buf[q], buf[q + 1].astype(np.int64)
    end = q + 2 + size
    framed = size < 0x80 if e is None else (size < 0x80) & (end <= e)
    key_len = buf[q + 3].astype(np.int64)
    k_at = q + 4 + key_len
    item = (framed & (b0 == 0x0A) & (size >= 5) & (buf[q + 2] == 0x0A) & (key_len < 0x80)
            & (5 + key_len <= size) & (buf[k_at] == 0x82) & (buf[k_at + 1] == 0x01)
            & (buf[k_at + 2] == size - 5 - key_len))
    step_value = np.full(len(q), -1, dtype=np.int64)
    step = ~item & framed & (b0 == 0x12) & (size >= 2) & (buf[q + 2] == 0x08)
    if step.any():
        value, value_end, ended = _varint_values(buf, q[step] + 3, 8)
        step_value[step] = np.where(ended & (value_end <= end[step]) & (value <= 1 << 53), value, -1)
    return item, step_value, end


def chained_items(buf: np.ndarray, recs: np.ndarray, h_start: np.ndarray,
                  h_end: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The items of the records ``recs`` whose HistoryRecord ``buf[h_start:h_end]`` is nothing but items
    ``0a L 0a K <key> 82 01 V <value>`` and steps ``12 L 08 <varint>`` as :func:`history_items` reads them,
    found without walking: every place in their histories where such a field would start (0x0A and a
    0x0A two bytes on, or 0x12 and a 0x08; its lengths below 128 and consistent, a step's number at most
    2^53: :func:`item_or_step`) is a candidate, and a record is read so when its candidates chain, the
    first at its history's start, each ending where the next starts, the last at its end: then they are
    the fields a walk from the start meets, and only those (a candidate inside an item breaks the chain:
    that record is walked). (which of ``recs`` were read; (record, position, k-th item of the record, step
    number or -1) of their items). A 5,000-key record costs its bytes' share of a few passes, not 5,000
    steps of the walk: a mixture of experts' log of 500 such records 5.7 -> 3.6 s to read."""
    order = np.argsort(h_start[recs], kind="stable")
    recs = recs[order]
    lo, hi = h_start[recs], h_end[recs]
    base = int(lo[0])
    span = buf[base:int(hi.max()) + 2]  # (the gathers after it: _PAD)
    tag, third = span[:-2], span[2:]
    p = base + np.flatnonzero(((tag == 0x0A) & (third == 0x0A)) | ((tag == 0x12) & (third == 0x08)))
    owner = np.searchsorted(lo, p, side="right") - 1
    inside = owner >= 0
    inside[inside] &= p[inside] < hi[owner[inside]]
    p, owner = p[inside], owner[inside]
    item, step_value, end = item_or_step(buf, p)  # (their ends in the history: the chain's are checked)
    field = item | (step_value >= 0)
    p, owner, end, step_value = p[field], owner[field], end[field], step_value[field]
    first = np.searchsorted(owner, np.arange(len(recs)))  # each record's first candidate (owner is sorted)
    count = np.bincount(owner, minlength=len(recs))
    chained = np.ones(len(p), dtype=bool)
    chained[:-1] = (end[:-1] == p[1:]) | (owner[:-1] != owner[1:])  # (a record's last: checked below)
    broken = np.bincount(owner[~chained], minlength=len(recs)) > 0
    last = first + count - 1
    ok = (count > 0) & ~broken
    ok[ok] &= (p[first[ok]] == lo[ok]) & (end[last[ok]] == hi[ok])
    keep = ok[owner]
    kth = np.arange(len(p)) - first[owner]
    return recs[ok], (recs[owner[keep]], p[keep], kth[keep], step_value[keep])


def history_items(buf: np.ndarray, status: np.ndarray, h_start: np.ndarray, h_end: np.ndarray) -> Items:
    """The items of the HistoryRecords ``buf[h_start:h_end]`` of the records of ``status`` HISTORY, the
    k-th field of every record at the k-th step: items ``0a L 0a K <key> 82 01 V <value>`` with L, K, V
    below 128 and ``L == K + V + 5`` (the layout history_rows' fast path reads), the step ``12 L 08
    <varint>`` (L below 128, the number at most 2^53); other fields (``_info``; a field 1 or 2 of another
    wire type) skipped, as history_rows skips them. A record holding anything else (an item of another
    layout, a malformed field) is set TO_PYTHON in ``status`` (its items dropped), and so are the records
    still being read when fewer than FEW_RECORDS are, past their first 64 items: a step of a few arrays
    costs ~40 us, the Python reader ~3 us an item (6 records of 65,000 keys: 3.6 -> 1.2 s). Histories of
    LONG_HISTORY bytes or more are first looked for by their bytes (:func:`chained_items`); those it reads
    are not walked."""
    live = np.flatnonzero(status == HISTORY)
    found: list[tuple[np.ndarray, ...]] = []
    taken = np.zeros(len(status), dtype=np.int64)  # each record's items so far
    long = live[h_end[live] - h_start[live] >= LONG_HISTORY]
    if len(long):  # long records: their items by their bytes (chained_items), the rest walked below
        done, items = chained_items(buf, long, h_start, h_end)
        if len(done):
            found.append(items)
            taken += np.bincount(items[0], minlength=len(status))
            live = live[~np.isin(live, done)]
    q = h_start[live]
    steps = 0
    while len(live):
        steps += 1
        if steps > 64 and len(live) < FEW_RECORDS:
            status[live] = TO_PYTHON
            break
        e = h_end[live]
        more = q < e
        if not more.all():
            live, q, e = live[more], q[more], e[more]
        if not len(live):
            break
        item, step_value, end = item_or_step(buf, q, e)
        if not item.all():
            other = ~item & (step_value < 0)
            tag, _, field_end, odd = fields_at(buf, q[other], e[other])
            skipped = ~odd & ((tag >> 3 > 2) | (tag & 7 == 0))  # (a fixed-width 1 or 2: bytes to Python)
            status[live[other][~skipped]] = TO_PYTHON
            end[other] = field_end
            emit = ~other
            keep = emit.copy()
            keep[other] = skipped
            if not keep.all():
                live, q, end, emit, step_value = live[keep], q[keep], end[keep], emit[keep], step_value[keep]
        else:
            emit = item
        at = live[emit]
        found.append((at, q[emit], taken[at], step_value[emit]))
        taken[at] += 1
        q = end
    if not found:
        none = np.zeros(0, dtype=np.int64)
        return Items(none, none, none, none, none, none)
    record, at, kth, step_num = (np.concatenate(c) for c in zip(*found))
    order = np.empty(len(record), dtype=np.int64)
    order[(np.cumsum(taken) - taken)[record] + kth] = np.arange(len(record))
    order = order[status[record[order]] == HISTORY]
    record, at, step_num = record[order], at[order], step_num[order]
    step = step_num >= 0
    key_len = np.where(step, 5, buf[at + 3])
    value_len = np.where(step, 0, buf[at + 1].astype(np.int64) - 5 - key_len)
    return Items(record, np.where(step, -1, at + 4), key_len, np.where(step, 0, at + 7 + key_len), value_len,
                 np.maximum(step_num, 0))


def _counter(width: int) -> type:
    """The smallest unsigned type counting to ``width`` (counts of bytes in uint8 are the fastest)."""
    return np.uint8 if width < 256 else np.uint16 if width < 1 << 16 else np.int64


_NUMBER_STARTS = np.zeros(256, dtype=bool)
_NUMBER_STARTS[list(b"-0123456789NI")] = True  # what a JSON number, NaN, Infinity, -Infinity start with

# number_texts' kinds
NOT_A_NUMBER, FLOAT, INTEGER, UNSURE = 0, 1, 2, 3


def number_texts(texts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """How :func:`~gradtool.io.wandb_log._number` reads each value text (a column of ``texts``, its first
    ``lengths`` bytes, zeros after): NOT_A_NUMBER when empty or not starting like a number, INTEGER when
    all digits (at most 15), FLOAT when a JSON-like number ``-?D*(.D*)?([eE][+-]?D+)?`` with a digit before
    any exponent (all of which float() reads), else UNSURE (NaN, Infinity, an underscore, more digits:
    left to Python). Texts are columns so that every step is one NumPy operation over rows of bytes."""
    width, n = texts.shape
    kinds = np.full(n, UNSURE, dtype=np.int8)
    if not n:
        return kinds
    count = _counter(width)
    column = np.arange(width, dtype=count)[:, None]
    digit = (texts - np.uint8(48)) < 10
    dot = texts == ord(".")
    exp = (texts | np.uint8(32)) == ord("e")
    sign = (texts == ord("-")) | (texts == ord("+"))
    other = ~(digit | dot | exp | sign) & (column < lengths)
    dots, exps = dot.sum(axis=0, dtype=count), exp.sum(axis=0, dtype=count)
    digits = digit.sum(axis=0, dtype=count)
    e_at = np.where(exps == 1, (exp * column).sum(axis=0, dtype=count), lengths)
    dot_at = np.where(dots == 1, (dot * column).sum(axis=0, dtype=count), 0)
    lead_minus = (column == 0) & (texts == ord("-"))
    misplaced_sign = sign & ~lead_minus & (column != e_at + 1)
    mantissa_digits = (digit & (column < e_at)).sum(axis=0, dtype=count)
    clean = (~other.any(axis=0) & (dots <= 1) & (exps <= 1) & ((dots == 0) | (dot_at < e_at))
             & ~misplaced_sign.any(axis=0) & (mantissa_digits >= 1)
             & ((exps == 0) | (digits > mantissa_digits)))
    kinds[clean] = FLOAT
    all_digits = digits == lengths
    kinds[all_digits] = UNSURE  # an int() that float64 may not hold
    kinds[all_digits & (lengths <= _MAX_INT_DIGITS)] = INTEGER
    kinds[(lengths == 0) | ~_NUMBER_STARTS[texts[0]]] = NOT_A_NUMBER
    return kinds


def parse_numbers(texts: np.ndarray) -> np.ndarray | None:
    """The float64 of each text (a column of ``texts``, zeros after it) as float() reads it: NumPy's text
    parser over the texts separated by spaces (``np.fromstring``, whose numbers are Python's own parser's,
    ``PyOS_string_to_double``); None when a text is not one number to it (the caller then classifies them:
    :func:`number_texts`)."""
    import warnings

    if not texts.shape[1]:
        return np.zeros(0)
    spaced = np.full((texts.shape[1], texts.shape[0] + 1), 32, dtype=np.uint8)
    spaced[:, :-1] = texts.T
    spaced[:, :-1][texts.T == 0] = 32
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # (NumPy < 2 warns where 2 raises)
            values = np.fromstring(spaced.tobytes(), dtype=np.float64, sep=" ")
    except (ValueError, DeprecationWarning):
        return None
    return values if len(values) == texts.shape[1] else None


_TENS = 10.0 ** np.arange(_MAX_INT_DIGITS)


def parse_integers(texts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The value of each text of digits only (at most 15, zeros after them): its digits left-aligned in 15
    places, ``sum(d_j 10^(14 - j))``, by one matrix product (exact: every partial sum an integer below
    2^53), divided by ``10^(15 - length)`` (exact: a multiple of it, and the quotient a double)."""
    digits = np.maximum(texts[:_MAX_INT_DIGITS], np.uint8(48)) - np.uint8(48)
    if len(digits) < _MAX_INT_DIGITS:
        digits = np.concatenate([digits, np.zeros((_MAX_INT_DIGITS - len(digits), texts.shape[1]), np.uint8)])
    aligned = _TENS[::-1] @ digits.astype(np.float64)
    return aligned / _TENS[_MAX_INT_DIGITS - lengths] if len(lengths) else aligned


def number_values(texts: np.ndarray, lengths: np.ndarray,
                  unread: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(kind, value) of each value text (a column of ``texts``, zeros after it): its kind as
    :func:`number_texts` gives it, and the value (float()'s or int()'s) of each FLOAT and INTEGER. Texts of
    the characters ``+,-./0-9eE`` alone starting with ``-`` or a digit are given to NumPy's parser directly
    (a text of those characters is a number to float() if and only if it is one number to that parser,
    which is float()'s own: should one not be, they are classified first), texts of digits alone read by
    :func:`parse_integers`, others classified by :func:`number_texts` (``NaN``, ``Infinity``: UNSURE).
    ``unread``: the texts whose floats nobody reads (wandb's ``_runtime``, ``_timestamp``): those of digits
    and one point (``1795521146.123456``) are FLOAT without being parsed (NaN, as the compiled reader
    leaves them)."""
    n = len(lengths)
    values = np.full(n, np.nan)
    if not n:
        return np.zeros(0, dtype=np.int8), values
    count = _counter(texts.shape[0])
    nonzero = (texts != 0).sum(axis=0, dtype=count)
    plain = ((texts - np.uint8(43)) <= 14) | ((texts | np.uint8(32)) == ord("e")) | (texts == 0)
    digits = ((texts - np.uint8(48)) < 10).sum(axis=0, dtype=count)
    starts = texts[0]
    simple = (plain.all(axis=0) & (nonzero == lengths)
              & ((starts == ord("-")) | ((starts - np.uint8(48)) < 10)))
    kinds = np.where(simple, FLOAT, UNSURE).astype(np.int8)
    integer = simple & (digits == lengths)
    kinds[integer] = np.where(lengths[integer] <= _MAX_INT_DIGITS, INTEGER, UNSURE)
    values[kinds == INTEGER] = parse_integers(texts[:, kinds == INTEGER], lengths[kinds == INTEGER])
    odd = np.flatnonzero(kinds == UNSURE)
    if len(odd):
        kinds[odd] = number_texts(texts[:, odd], lengths[odd])
    floats = kinds == FLOAT
    if unread is not None and unread.any():  # digits, one point, a digit first: a float to float()
        dots = (texts == ord(".")).sum(axis=0, dtype=count)
        floats &= ~(unread & simple & (digits == lengths - 1) & (dots == 1) & ((starts - np.uint8(48)) < 10))
    read = np.flatnonzero(floats)
    got = parse_numbers(texts[:, read])
    if got is None:  # a text of those characters that is not a number
        kinds[read] = number_texts(texts[:, read], lengths[read])
        read = read[kinds[read] == FLOAT]
        got = parse_numbers(texts[:, read])
        if got is None:
            raise AssertionError("a number NumPy's parser does not read")
    values[read] = got
    return kinds, values


def byte_columns(buf: np.ndarray, start: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """``buf[start:start + length]`` of each item as a column of ``width`` bytes, zeros after its length."""
    columns = np.empty((width, len(start)), dtype=np.uint8)
    for j in range(width):
        np.take(buf, start + j, out=columns[j])
    count = _counter(width)
    columns[np.arange(width, dtype=count)[:, None] >= lengths.astype(count)] = 0
    return columns


def byte_rows(buf: np.ndarray, start: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
    """``buf[start:start + length]`` of each item as a row of ``width`` bytes, zeros after its length."""
    rows = np.lib.stride_tricks.sliding_window_view(buf, width)[start]
    rows[np.arange(width) >= lengths[:, None]] = 0
    return rows


_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


def key_hashes(keys: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of ``keys`` (bytes, zeros after the key, a multiple of 8 wide) and its
    length: the key's 8-byte words mixed in turn by multiplication and shifts (the same whatever the width
    of the rows). Only which items share a key is taken from it, and it is checked (:class:`_Keys`)."""
    words = keys.view("<u8")
    h = lengths.astype(np.uint64) * _MULTIPLIER
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            mixed = (h ^ words[:, j]) * _MULTIPLIER
            mixed ^= mixed >> np.uint64(29)
            h = np.where(lengths > 8 * j, mixed, h)
    return h


class _Keys:
    """The log's keys so far: each one's hash (sorted, for searchsorted), index (first-seen order, in
    ``names``: bytes -> index, the :class:`~gradtool.io.wandb_log._Rows` dict) and bytes."""

    def __init__(self, names: dict[bytes, int]):
        self.names = names
        self.hashes = np.zeros(0, dtype=np.uint64)
        self.ids = np.zeros(0, dtype=np.int64)
        self.bytes_of: list[bytes] = list(names)

    def ids_of(self, hashes: np.ndarray, rows: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
        """The index of each item's key (``hashes``, its bytes ``rows``): keys not seen before added in
        the items' order; None when an item's bytes are not its hash's key's (a collision)."""
        at = np.searchsorted(self.hashes, hashes)
        known = self.hashes[np.minimum(at, len(self.hashes) - 1)] == hashes if len(self.hashes) else \
            np.zeros(len(hashes), dtype=bool)
        if not known.all():
            new = np.flatnonzero(~known)
            _, first = np.unique(hashes[new], return_index=True)
            added = np.sort(new[first])
            for i in added.tolist():
                name = rows[i, :lengths[i]].tobytes()
                if name in self.names:  # the same bytes under another hash: cannot be
                    return None
                self.names[name] = len(self.names)
                self.bytes_of.append(name)
            # (appended together: one array a key made 65,000 keys quadratic)
            self.hashes = np.concatenate((self.hashes, hashes[added]))
            self.ids = np.concatenate((self.ids, np.arange(len(self.names) - len(added), len(self.names))))
            order = np.argsort(self.hashes)
            self.hashes, self.ids = self.hashes[order], self.ids[order]
            at = np.searchsorted(self.hashes, hashes)
        ids = self.ids[at]
        width = rows.shape[1]
        table = np.zeros((len(self.bytes_of), width), dtype=np.uint8)
        for j, name in enumerate(self.bytes_of):
            table[j, :min(len(name), width)] = np.frombuffer(name[:width], dtype=np.uint8)
        lengths_of = np.array([len(b) for b in self.bytes_of], dtype=np.int64)
        if (lengths_of[ids] != lengths).any() or (table[ids] != rows).any():
            return None
        return ids


def _read_full(f: Any, view: memoryview) -> int:
    """Read into ``view`` until it is full or the file ends; the bytes read."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def read_rows(path: str, source: str, rows: Any) -> bool:
    """Append the history rows of the W&B run log at ``path`` to ``rows`` (a
    :class:`~gradtool.io.wandb_log._Rows`), as the Python reader reads them, with its errors (naming
    ``source``). False when two keys' hashes collide (then nothing is to be taken from ``rows``: the
    caller reads the log in Python)."""
    from .logs import MAX_LOG_BYTES
    from .wandb_log import MAX_RECORD, is_wandb_log

    size = os.path.getsize(path)
    if size > MAX_LOG_BYTES:
        raise InputError(f"{source}: log larger than {MAX_LOG_BYTES >> 30} GiB")
    chunk = bytearray(CHUNK_BLOCKS * BLOCK + _PAD)
    whole = memoryview(chunk)[:CHUNK_BLOCKS * BLOCK]
    reader = _ChunkReader(source, rows, _Joiner(MAX_RECORD))
    offset = 0
    try:
        with open(path, "rb") as f:
            while True:
                n = _read_full(f, whole)
                if offset == 0 and not is_wandb_log(bytes(chunk[:7])[:n]):
                    raise InputError(f"{source}: not a W&B run log (no :W&B header)")
                if not n:
                    return True
                chunk[n:n + _PAD] = bytes(_PAD)
                bad = reader.read(chunk, n, offset)
                if bad is None:
                    return False
                if bad >= 0:
                    if offset + bad // BLOCK * BLOCK + BLOCK >= size:
                        return True  # in the last block: a write cut off (a run still going, or killed)
                    raise InputError(f"{source}: damaged W&B log (bad record at byte {offset + bad})")
                if n < len(whole):
                    return True
                offset += n
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror or exc})") from None


class _ChunkReader:
    """The rows of one chunk of a log after another into ``rows`` (see :func:`read_rows`)."""

    def __init__(self, source: str, rows: Any, joiner: _Joiner):
        self.source, self.rows, self.joiner = source, rows, joiner
        self.keys = _Keys(rows.keys)
        self.skip: set[bytes] = rows.skip  # keys whose floats nobody reads

    def read(self, chunk: bytearray, n: int, offset: int) -> int | None:
        """Read the records of ``chunk[:n]`` (``offset`` bytes into the log): the position in the chunk of
        its first bad record (its rows before it read), -1 when none; None on a hash collision."""
        buf = np.frombuffer(chunk, dtype=np.uint8)
        pos, length, kind, bad = frame_records(buf, n, _HEADER if offset == 0 else 0)
        if bad >= 0:
            keep = pos < bad
            pos, length, kind = pos[keep], length[keep], kind[keep]
        stored = (buf[pos].astype(np.uint32) | buf[pos + 1].astype(np.uint32) << 8
                  | buf[pos + 2].astype(np.uint32) << 16 | buf[pos + 3].astype(np.uint32) << 24)
        wrong = crc_mismatch(chunk, pos, length, stored)
        if wrong >= 0:
            bad = int(pos[wrong])
            pos, length, kind = pos[:wrong], length[:wrong], kind[:wrong]
        ends, joined = self.joiner.join(memoryview(chunk), pos, length, kind)
        whole = np.flatnonzero(kind == _FULL)
        start = pos[whole] + _HEADER
        size = length[whole]
        if joined:
            sizes = np.array([len(j) for j in joined], dtype=np.int64)
            buf = np.concatenate([buf[:n], np.frombuffer(b"".join(joined), dtype=np.uint8),
                                  np.zeros(_PAD, dtype=np.uint8)])
            order = np.argsort(np.concatenate([whole, np.array(ends, dtype=np.int64)]), kind="stable")
            start = np.concatenate([start, n + np.cumsum(sizes) - sizes])[order]
            size = np.concatenate([size, sizes])[order]
        if not self._add(buf, start, start + size):
            return None
        return bad

    def _add(self, buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> bool:
        """Add the rows of the whole records ``buf[start:end]``, in order."""
        from .wandb_log import history_rows

        status, h_start, h_end = record_histories(buf, start, end)
        items = history_items(buf, status, h_start, h_end)
        by_python: dict[int, dict[str, Any]] = {}
        for r in np.flatnonzero(status == TO_PYTHON).tolist():
            try:
                row = history_rows(buf[start[r]:end[r]].tobytes())
            except ValueError as exc:
                raise InputError(f"{self.source}: damaged W&B record ({exc})") from None
            if row is not None:
                by_python[r] = row
        is_row = status == HISTORY
        is_row[list(by_python)] = True
        row_of = self.rows.rows + np.cumsum(is_row) - 1
        got = self._items(buf, items, by_python)
        if got is None:
            return False
        record, ids, values, is_int, exact = got
        self.rows.extend(values, row_of[record], ids << 1 | is_int, int(is_row.sum()), exact)
        return True

    def _unread(self, names: np.ndarray, lengths: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """Which items' keys are in the reader's set of keys whose floats nobody reads."""
        unread = np.zeros(len(lengths), dtype=bool)
        for name in self.skip:
            if len(name) > names.shape[1]:
                continue
            row = np.zeros((1, names.shape[1]), dtype=np.uint8)
            row[0, :len(name)] = np.frombuffer(name, dtype=np.uint8)
            at = np.flatnonzero(hashes == key_hashes(row, np.array([len(name)]))[0])
            unread[at[(lengths[at] == len(name)) & (names[at] == row).all(axis=1)]] = True
        return unread

    def _items(self, buf: np.ndarray, items: Items,
               by_python: dict[int, dict[str, Any]]) -> tuple[np.ndarray, ...] | None:
        """(record, key index, value, is_int, exact) of the numeric items of the records in order: those of
        ``items`` and those of the rows Python read (``by_python``: record -> row); None on a collision."""
        from .wandb_log import _number

        extra = [(r, k.encode(), v) for r, row in by_python.items() for k, v in row.items()]
        step = items.key < 0
        name_len = np.where(step, 5, items.key_len)
        width = -(-max(int(name_len.max(initial=0)), *(len(k) for _, k, _ in extra), 1) // 8) * 8
        names = byte_rows(buf, np.where(step, 0, items.key), np.where(step, 0, name_len), width)
        names[step, :5] = np.frombuffer(b"_step", dtype=np.uint8)
        hashes = key_hashes(names, name_len)
        texts = byte_columns(buf, items.value, items.value_len, int(items.value_len.max(initial=1)))
        kinds = np.full(len(items), INTEGER, dtype=np.int8)
        values = items.step.astype(np.float64)
        unread = self._unread(names, name_len, hashes)
        kinds[~step], values[~step] = number_values(texts[:, ~step], items.value_len[~step], unread[~step])
        exact = True
        for i in np.flatnonzero(kinds == UNSURE).tolist():
            number = _number(texts[:items.value_len[i], i].tobytes())
            kinds[i] = NOT_A_NUMBER if number is None else INTEGER if type(number) is int else FLOAT
            if number is not None:
                exact &= _fits(number)
                values[i] = float(number) if _fits(number) else 0.0
        record = items.record
        if extra:
            exact &= all(_fits(v) for _, _, v in extra)
            names_extra = np.zeros((len(extra), width), dtype=np.uint8)
            for j, (_, k, _) in enumerate(extra):
                names_extra[j, :len(k)] = np.frombuffer(k, dtype=np.uint8)
            lengths_extra = np.array([len(k) for _, k, _ in extra], dtype=np.int64)
            record = np.concatenate([record, np.array([r for r, _, _ in extra], dtype=np.int64)])
            name_len = np.concatenate([name_len, lengths_extra])
            names = np.concatenate([names, names_extra])
            hashes = np.concatenate([hashes, key_hashes(names_extra, lengths_extra)])
            values = np.concatenate([values, [float(v) if _fits(v) else 0.0 for _, _, v in extra]])
            kinds = np.concatenate([kinds, np.array(
                [INTEGER if type(v) is int else FLOAT for _, _, v in extra], dtype=np.int8)])
            order = np.argsort(record, kind="stable")
            order = order[kinds[order] != NOT_A_NUMBER]
        else:
            order = np.flatnonzero(kinds != NOT_A_NUMBER)
        names, name_len = names[order], name_len[order]
        ids = self.keys.ids_of(hashes[order], names, name_len)
        if ids is None:
            return None
        return record[order], ids, values[order], kinds[order] == INTEGER, exact


def _fits(number: float | int) -> bool:
    """Whether float64 holds the logged number exactly as the log wrote it (an int beyond 2^53 it cannot)."""
    return type(number) is not int or -(1 << 53) <= number <= 1 << 53
