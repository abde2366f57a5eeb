"""Console lines that end in a dict of metrics as a gradient-norm history: the Hugging Face Trainer's
``{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}`` (a Python repr: single
quotes, bare ``nan``) and fairseq's ``... | train_inner | {"num_updates": "100", "gnorm": "3.4", ...}``.
The pairs are read with a pattern (:data:`_DICT_PAIR`), never evaluated.

Two readers give the same history (property-tested in tests/suggest/test_dict_lines.py). The general one
(:func:`_general_records`) reads each line with the patterns and makes a dict of it, then
:func:`~gradtool.io.logs.from_records` (~7 us a line). The template reader (:class:`_DictTemplate`)
makes a pattern of the first line with a norm, values free, and reads the lines it matches into
:class:`~gradtool.io.logs.KeyColumns`: by the compiled reader (``dict_lines`` in gradtool/io/_logscan.c,
~0.2 us a line), else by one ``findall`` over a block of lines and ``float`` over each value column; the
lines it does not match (an evaluation's dict) are read by the general reader's patterns in their place.
10^6 of the Trainer's lines: 6.5 s -> 0.9 s (2.4 s without the compiled reader). A large log is read by
the compiled reader from the bytes of its memory-mapped file (:func:`read_mapped_dict_lines`), never
decoded whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from itertools import chain, compress
from operator import itemgetter
from typing import Any

from .logs import (STEP_KEYS, KeyColumns, NormHistory, _find_key, _find_norm_key, _last_training, _noted,
                   _num, _read_text, from_records, from_row_items)
from .text_logs import _newline_lines, _without_fairseq_epoch_ends, is_fairseq

_DICT_TAIL = re.compile(r"\{[^{}]*\}\s*$")  # a line that ends in a flat {...} of metrics
_DICT_PAIR = re.compile(r"""(['"])([^'"]*)\1\s*:\s*(?:(['"])([^'"]*)\3|([^,}'"\s][^,}]*))""")


def read_dict_lines(path: str, key: str | None = None, text: str | None = None) -> NormHistory | None:
    """The history of the lines of a log that end in a dict of metrics, the way trainers print them to
    the console (see the module's docstring). None when no such line holds a gradient norm. Without a
    step key (the Trainer prints none) the steps are the lines' order, and the history says so; when
    the records have an ``epoch`` (the Trainer's), those with a norm from the last training on (the epoch
    starting over) are read."""
    text = _read_text(path) if text is None else text
    table = None if is_fairseq(text) else _DictTemplate.table(text)
    if table is not None:
        return _table_history(table, path, key)
    records, keys, notes = _general_records(text, key)
    hist = None if records is None else from_records(records, path, "console", key)
    return None if hist is None else _console_history(hist, path, keys, notes)


def no_norm_in_dict_lines(path: str, key: str | None, text: str) -> Exception | None:
    """The error to give for a log that ``text`` holds whose dict lines (``{'loss': ...}``) hold no gradient
    norm, or none named ``key`` (``--key``): a usage error that lists their keys, or without ``key`` an
    input error that says to name one (:func:`~gradtool.io.logs.no_norm_metric`); the other readers'
    ("no JSON objects found", "no 'grad norm: X' values") miss what the log is. None when it has no dict
    lines, or they hold the norm (its values are not numbers: the other reader's error stands)."""
    from .logs import no_norm_metric

    table = None if is_fairseq(text) else _DictTemplate.table(text)  # (a template: a line with a norm)
    keys = table.keys() if table is not None else _general_records(text, key)[1]
    if not keys or _find_norm_key(keys, key) is not None:
        return None
    return no_norm_metric(f"{path}: its dict lines have", keys, key)


def read_mapped_dict_lines(path: str, key: str | None, source: str,
                           reads_first: Callable[[str, bool], bool]) -> NormHistory | None:
    """:func:`read_dict_lines` of the log at ``path`` (``source`` names it) read from a memory map of its
    file, its UTF-8 bytes as they are, by the compiled reader (``dict_lines`` of bytes): no decoded copy of
    the whole text (2 or 4 bytes a character once one character needs them: a progress bar's blocks,
    wandb's rocket), only the lines the compiled reader leaves and the first block, where the template
    is found; without the compiled reader (or for a template of text that is not ASCII), a block of
    bytes decoded at a time. None (the caller decodes the text and reads it as before) where this does
    not apply: a file :func:`~gradtool.io.logs.mapped_utf8_log` does not map, a text whose start
    ``reads_first(head, whole)`` (its first block; whether that is the whole text) says is not read by
    :func:`read_dict_lines` first, fairseq's console, no template in the first block, or records without
    a gradient norm. The same history as :func:`read_dict_lines` of the decoded text (property-tested:
    line breaks of every kind, invalid UTF-8, characters of every width). The 10^6 steps of the Trainer's
    console after wandb's banner: 1.1 GB of text not made (0.4-1.1 s; without the compiled reader
    2.3-2.4 -> 1.8 s)."""
    from .logs import mapped_utf8_log

    with mapped_utf8_log(path) as mapped:
        if mapped is None:
            return None
        data, start = mapped
        head = _utf8_head(data, start, _DictTemplate.BLOCK)
        if head is None or not reads_first(*head):
            return None
        template = _DictTemplate._first(_newline_lines(head[0]))  # (before fairseq's search of the
        if template is None or is_fairseq(data):  # whole log: a log of other lines has no template)
            return None
        table = _DictTemplate.table_of_utf8(data, start, template)
    return _table_history(table, source, key)


def _utf8_head(data: Any, start: int, chars: int) -> tuple[str, bool] | None:
    """(the text ``data[start:]`` decodes to, up to the end of the line holding its character ``chars``;
    whether that is the whole text), as the whole text decoded has it (invalid bytes replaced); None when
    that line does not end in the first ``4 * chars`` bytes (a character is at most four) and 64 KiB. The
    first ``chars`` bytes and 64 KiB are decoded first (a text mostly ASCII: a quarter of the work)."""
    for size in (chars + (1 << 16), 4 * chars + (1 << 16)):
        whole = len(data) - start <= size
        text = str(data[start:start + size], "utf-8", "replace")  # (a character cut at the end may differ:
        m = _LINE_BREAK.search(text, min(chars, len(text)))  # a break found is before it)
        if m is not None or whole:
            return text[:len(text) if m is None else m.end()], whole and m is None
    return None


def _table_history(table: _DictTable, path: str, key: str | None) -> NormHistory | None:
    """What :func:`read_dict_lines` gives of the records the template reader read (``table``)."""
    items, keys, notes = _template_records(table, key)
    hist = None if items is None else from_row_items(items, path, "console", key)
    return None if hist is None else _console_history(hist, path, keys, notes)


def _template_records(table: _DictTable,
                      key: str | None) -> tuple[KeyColumns | None, dict[str, None], list[str]]:
    """The records :func:`read_dict_lines` reads by the template reader (:meth:`_DictTemplate.table`), as
    :class:`~gradtool.io.logs.KeyColumns`, the keys of all the records, and notes; the records None when
    none holds a gradient norm."""
    all_keys = table.keys()
    if not table.n or (nkey := _find_norm_key(all_keys, key)) is None:
        return None, all_keys, []
    notes: list[str] = []
    kept = None  # the records read (None: all)
    if _find_key(all_keys, STEP_KEYS) is None and "epoch" in all_keys:  # the Trainer's: no step, but its epoch
        import numpy as np

        with_norm = np.flatnonzero(table.column(nkey)[1])
        epochs, is_number, _ = table.column("epoch")
        if with_norm.size and bool(np.all(is_number[with_norm])):
            epochs = epochs[with_norm]  # (no epoch going back: what _last_training's loop would find)
            cut, notes = (_last_training(epochs.tolist(), "epoch") if bool(np.any(epochs[1:] < epochs[:-1]))
                          else (0, []))
            kept = with_norm[cut:]
    return table.items(kept), all_keys, notes


def _general_records(text: str, key: str | None) -> tuple[list[dict[str, Any]] | None, dict[str, None], list[str]]:
    """:func:`_template_records` by the general reader: a dict a line (fairseq's end-of-epoch lines left
    out), as a list."""
    lines, fairseq_notes = _without_fairseq_epoch_ends(text, text.splitlines())
    records = [r for r in map(_record_of_line, lines) if r is not None]
    keys = dict.fromkeys(k for r in records for k in r)
    if not records or (nkey := _find_norm_key(keys, key)) is None:
        return None, keys, []
    notes = []
    if _find_key(keys, STEP_KEYS) is None and "epoch" in keys:  # the Trainer's: no step, but its epoch
        with_norm = [r for r in records if _num(r.get(nkey)) is not None]
        epochs = [_num(r.get("epoch")) for r in with_norm]
        if with_norm and None not in epochs:
            cut, notes = _last_training(epochs, "epoch")  # the epoch starting over: another training
            records = with_norm[cut:]
    return records, keys, notes + fairseq_notes


def _record_of_line(line: str) -> dict[str, Any] | None:
    """The dict a line ends in, as the general reader reads it (values as strings), or None."""
    m = _DICT_TAIL.search(line)
    if m is None:
        return None
    pairs = _DICT_PAIR.findall(m.group())  # a bare tensor(1.2, device='cuda:0'): transformers 4.38's norm
    return {k: quoted if q else bare.strip().removeprefix("tensor(") for _, k, q, quoted, bare in pairs}


def _console_history(hist: NormHistory, path: str, keys: dict[str, None], notes: list[str]) -> NormHistory | None:
    """What :func:`read_dict_lines` gives of the history ``hist`` of the records (``keys``: all of theirs):
    with ``notes``, None when it has no steps (no number where the norm should be: not this kind of log),
    the steps said to be the lines' order when no step is logged."""
    hist = _noted(hist, notes)
    if not len(hist):  # (len: the steps' list is not made from their array)
        return None
    if _find_key(keys, STEP_KEYS) is None:
        hist.line_order = True
        # the Trainer's console (transformers' ProgressCallback prints floats as f"{v:.4g}" strings)
        better = ("; the Trainer's trainer_state.json (in each checkpoint-*/ of its output directory) has "
                  "the steps, and every digit" if "epoch" in keys else "")
        hist.notes.append(f"{path}: the log gives no step numbers: steps are the order of its lines "
                          f"(0, 1, 2, ...), not training steps{better}")
    return hist


# A value a template reads: what _DICT_PAIR reads the same whatever follows it (no quote, comma, brace,
# space, colon, parenthesis), that float() reads as a number or not at all
_VALUE = "[0-9A-Za-z_.+-]"


class _DictTemplate:
    """The dict a line ends in as a pattern of a whole line: any text without braces before it, its keys
    and the text between them fixed, each value free (:data:`_VALUE`: bare, or quoted as it was), spaces
    and tabs after it. Made only from a dict whose pairs are separated by a comma and spaces alone, whose
    keys are distinct and each value is one such token, followed by the comma or brace (``'loss': 2.3 ,``
    reads "2.3 " stripped: no template). A line the pattern matches then holds one ``{``, and
    :data:`_DICT_PAIR` finds in its dict exactly the template's pairs, at the same places (a match starts
    at a quote; the fixed text between pairs has none, the values none), with its values: the tokens the
    groups capture (a bare value's greedy ``[^,}]*`` stops at the comma or brace after it, and it has no
    spaces to strip nor ``tensor(`` to remove), so the general reader's dict of it is ``{key_j: group_j}``."""

    BLOCK = 1 << 22  # characters of the log read by one findall (its tuples a block at a time)

    def __init__(self, keys: list[str], pattern: str, ops: tuple[tuple[Any, ...], ...] | None) -> None:
        self.keys = keys
        # a line: the template's (its values captured, the last group empty) or another (the last group)
        self.lines = re.compile(rf"^(?:{pattern}|(.+))$", re.MULTILINE)
        # the pattern from its "{" on as the compiled reader's operations (dict_lines in
        # gradtool/io/_logscan.c): (0, ASCII text), (3,) a value; None when the text is not ASCII
        self.ops = ops

    @classmethod
    def of(cls, line: str) -> _DictTemplate | None:
        """The template of the dict ``line`` ends in, or None (see the class docstring)."""
        m = _DICT_TAIL.search(line)
        if m is None:
            return None
        d, pos, keys = m.group(), 1, []
        pieces = [r"[^{}\n]*\{"]
        texts, fixed = [], 1  # the fixed text before each value and after the last (for the ops), from
        for p in _DICT_PAIR.finditer(d):
            if not re.fullmatch(r"[ \t]*,[ \t]*" if keys else r"[ \t]*", d[pos:p.start()]):
                return None
            k, quote = p.group(2), p.group(3) or ""
            value = 4 if quote else 5
            if not re.fullmatch(f"{_VALUE}*" if quote else f"{_VALUE}+", p.group(value)):
                return None
            pieces.append(f"{re.escape(d[pos:p.start(value)])}({_VALUE}{'*' if quote else '+'}){re.escape(quote)}")
            texts.append(d[fixed:p.start(value)])
            keys.append(k)
            pos, fixed = p.end(), p.end(value)  # (a quoted value's closing quote: the next text's)
        if not keys or len(set(keys)) != len(keys) or not re.fullmatch(r"[ \t]*\}[ \t]*", d[pos:]):
            return None
        close = d.rindex("}") + 1
        pieces.append(re.escape(d[pos:close]) + r"[ \t]*")
        texts.append(d[fixed:close])
        ops: list[tuple[Any, ...]] = []
        for i, between in enumerate(texts):
            ops.extend([(0, between.encode())] + ([(3,)] if i < len(keys) else []))
        return cls(keys, "".join(pieces), tuple(ops) if all(t.isascii() for t in texts) else None)

    @classmethod
    def table(cls, text: str) -> _DictTable | None:
        """The dict records of the lines of ``text``, as the general reader makes them, by the template of
        the first with a gradient-norm key (its other lines read by the general reader in their place);
        None when no line makes a template. With the compiled reader (``dict_lines`` in
        gradtool/io/_logscan.c), the lines it reads (the template's, values it reads as ``float`` does,
        and lines without a "{") are read by it, the others here from the line it stops at (a block
        doubling from 4 KiB while it stops at once), then it again."""
        from .compiled import log_readers

        template = cls._first(_newline_lines(text[:_line_end(text, cls.BLOCK)]))
        if template is None:
            return None
        readers = log_readers() if template.ops is not None else None
        return cls._read(template, text, 0, readers, _line_end, lambda lo, hi: text[lo:hi])

    @classmethod
    def table_of_utf8(cls, data: Any, start: int, template: _DictTemplate) -> _DictTable:
        """:meth:`table` of the text UTF-8 bytes ``data[start:]`` decode to (invalid bytes replaced), read
        from the bytes by the compiled reader and the lines it leaves decoded one block at a time;
        ``template``: that of the text's first block (:func:`_utf8_head`)."""
        from .compiled import log_readers

        readers = log_readers() if template.ops is not None else None
        return cls._read(template, data, start, readers, _utf8_line_end,
                         lambda lo, hi: str(data[lo:hi], "utf-8", "replace"))

    @classmethod
    def _read(cls, template: _DictTemplate, text: Any, pos: int, readers: Any,
              line_end: Callable[[Any, int], int], lines: Callable[[int, int], str]) -> _DictTable:
        """The records of ``text`` (a str, or UTF-8 bytes) from offset ``pos`` on by ``template``: lines
        the compiled reader (``readers``, or None) reads, the others in blocks of whole lines (``line_end``
        of an offset: where its line ends; ``lines(lo, hi)``: the text of the lines between)."""
        records = _Records(template)
        size, n = 0, len(text)
        out = [bytearray() for _ in template.keys]
        while pos < n:
            if readers is None:
                hi = line_end(text, pos + cls.BLOCK)
            else:
                pos, got = readers.dict_lines(template.ops, text, pos, out)
                if got:
                    records.add_values(out, got)
                size = 0 if got else min(max(2 * size, 1 << 12), cls.BLOCK)
                hi = line_end(text, pos + size)
            records.add_lines(lines(pos, hi))
            pos = hi
        return records.table()

    @classmethod
    def _first(cls, text: str) -> _DictTemplate | None:
        """The template of the first line of ``text`` (a log's first block, its breaks all "\\n") that ends
        in a dict with a gradient-norm key and makes one (None: the general reader's)."""
        for m in re.finditer(r"\{[^{}\n]*\}[ \t]*$", text, re.MULTILINE):
            line = text[text.rfind("\n", 0, m.start()) + 1:m.end()]
            record = _record_of_line(line)
            if record and _find_norm_key(record, None) is not None and (template := cls.of(line)):
                return template
        return None


class _Records:
    """The dict records of a log's lines as :meth:`_DictTemplate.table` reads them, in order: those of
    the template's lines (the records' numbers ``spans``, each template key's (values, flags) ``parts``,
    a block at a time) and the ``others`` (record, dict) the general reader read."""

    def __init__(self, template: _DictTemplate) -> None:
        self.template, self.n = template, 0
        self.spans: list[Any] = []
        self.parts: list[list[tuple[Any, Any]]] = [[] for _ in template.keys]
        self.others: list[tuple[int, dict[str, Any]]] = []

    def add_values(self, out: list[bytearray], rows: int) -> None:
        """``rows`` template lines the compiled reader read: their values in ``out`` (emptied)."""
        import numpy as np

        for part, column in zip(self.parts, out):
            part.append((np.frombuffer(column, np.float64).copy(), np.ones(rows, dtype=np.uint8)))
            del column[:]
        self.spans.append(np.arange(self.n, self.n + rows))
        self.n += rows

    def add_lines(self, lines: str) -> None:
        """The whole ``lines`` of a block, by the template's pattern and the general reader (their line
        breaks made "\\n" first)."""
        import numpy as np

        width = len(self.template.keys)
        block = _newline_lines(lines)
        if block.count("{") < block.count("\n") // 2:  # mostly lines without "{" (progress bars): no record
            block = "\n".join(line for line in block.split("\n") if "{" in line)  # (findall tried each of
        rows = self.template.lines.findall(block)  # their characters: 10^6 Trainer steps 5.4 -> 3.9 s)
        at = [i for i, line in enumerate(map(itemgetter(width), rows)) if line]
        if at:  # lines of another kind among them: each read as the general reader reads it
            read = [_record_of_line(rows[i][width]) for i in at]
            kind = np.zeros(len(rows), dtype=np.int8)  # 0: the template's, 1: another dict, 2: no dict
            kind[at] = [2 if r is None else 1 for r in read]
            record_at = self.n - 1 + np.cumsum(kind != 2)
            self.others.extend((int(record_at[i]), r) for i, r in zip(at, read) if r is not None)
            mine = kind == 0
            self.spans.append(record_at[mine])
            rows = list(compress(rows, mine.tolist()))
            self.n += int(np.count_nonzero(kind != 2))
        else:
            self.spans.append(np.arange(self.n, self.n + len(rows)))
            self.n += len(rows)
        for j, part in enumerate(self.parts):
            part.append(_floats(list(map(itemgetter(j), rows))))

    def table(self) -> _DictTable:
        import numpy as np

        columns = {k: (np.concatenate([v for v, _ in part]), np.concatenate([f for _, f in part]))
                   for k, part in zip(self.template.keys, self.parts)}
        return _DictTable(self.n, self.template.keys, np.concatenate(self.spans), columns, self.others)


_LINE_BREAK = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")  # str.splitlines()'s ("\r\n": "\r")


# the same breaks in UTF-8: sequences decoded as those characters wherever they are (no byte of them
# continues another sequence), so a search from any byte finds only breaks of the decoded text
_UTF8_LINE_BREAK = re.compile(b"[\n\r\x0b\x0c\x1c\x1d\x1e]|\xc2\x85|\xe2\x80[\xa8\xa9]")


def _line_end(text: str, at: int) -> int:
    """Where the line of ``text`` holding offset ``at`` ends, after its line break (or the text's end)."""
    m = _LINE_BREAK.search(text, min(at, len(text)))
    return len(text) if m is None else m.end()


def _utf8_line_end(data: Any, at: int) -> int:
    """:func:`_line_end` of UTF-8 bytes ``data`` (offsets in bytes): the end of the first line break from
    byte ``at`` on (which may be inside a character: the break found is one of the decoded text)."""
    m = _UTF8_LINE_BREAK.search(data, min(at, len(data)))
    return len(data) if m is None else m.end()


def _floats(texts: list[str]) -> tuple[Any, Any]:
    """(values, flags) of value strings as :func:`~gradtool.io.logs._num` reads them: float64 (NaN
    positive, as ``_num`` gives it; NaN where not a number), flag 1 where a number, 0 where not."""
    import numpy as np

    try:
        values = np.fromiter(map(float, texts), np.float64, len(texts))
        flags = np.ones(len(texts), dtype=np.uint8)
    except ValueError:
        nums = list(map(_num, texts))
        flags = np.array([x is not None for x in nums], dtype=np.uint8)
        values = np.array([math.nan if x is None else x for x in nums], dtype=np.float64)
    values[np.isnan(values)] = np.nan
    return values, flags


class _DictTable:
    """The dict records of a log's lines (``n`` of them, in order) as the template reader reads them: the
    template's ``keys``, the records it read (``rows``, ascending) and each key's (values, flags) there
    as :class:`~gradtool.io.logs.KeyColumns` has them (flag 1: a number, 0: none), and the ``others``
    read by the general reader as (record, dict)."""

    def __init__(self, n: int, keys: list[str], rows: Any, columns: dict[str, tuple[Any, Any]],
                 others: list[tuple[int, dict[str, Any]]]) -> None:
        self.n, self.template_keys, self.rows, self.others = n, keys, rows, others
        self._columns = columns

    def keys(self, kept: Any = None) -> dict[str, None]:
        """The keys of the records ``kept`` (ascending indices; None: all) in first-seen order."""
        import numpy as np

        rows, others = self.rows, self.others
        if kept is not None:
            keep = np.zeros(self.n, dtype=bool)
            keep[kept] = True
            rows = rows[keep[rows]]
            others = [(i, r) for i, r in others if keep[i]]
        firsts = ([(int(rows[0]), self.template_keys)] if rows.size else []) + [(i, list(r)) for i, r in others]
        firsts.sort(key=itemgetter(0))  # (no record in both)
        return dict.fromkeys(chain.from_iterable(ks for _, ks in firsts))

    def column(self, name: str) -> tuple[Any, Any, Any]:
        """(values, flags, given) of key ``name`` over all the records: flags as
        :class:`~gradtool.io.logs.KeyColumns` has them, and where a record has the key (a number or not)."""
        import numpy as np

        values, flags = np.full(self.n, np.nan), np.zeros(self.n, dtype=np.uint8)
        given = np.zeros(self.n, dtype=bool)
        if name in self._columns:
            values[self.rows], flags[self.rows] = self._columns[name]
            given[self.rows] = True
        at, got, there = [], [], []
        for i, r in self.others:
            if name in r:
                there.append(i)
                if (x := _num(r[name])) is not None:
                    at.append(i)
                    got.append(x)
        values[at], flags[at], given[there] = got, 1, True
        return values, flags, given

    def items(self, kept: Any = None) -> KeyColumns:
        """The records ``kept`` (ascending indices; None: all) as :class:`~gradtool.io.logs.KeyColumns`."""
        names = list(self.keys(kept))
        columns = [self.column(k) for k in names]
        if kept is not None:
            columns = [tuple(c[kept] for c in col) for col in columns]
        return _Columns(self.n if kept is None else len(kept), names, *(list(c) for c in zip(*columns)))


class _Columns(KeyColumns):
    """:class:`~gradtool.io.logs.KeyColumns` of dict records that may hold a key without a number (a word,
    an empty string): their :meth:`records`, for :func:`~gradtool.io.logs.from_records` when it reads
    them (steps beyond 2^53), keep such a key, as None (which its ``_num`` reads as it reads the word)."""

    def __init__(self, n_rows: int, keys: list[str], values: list[Any], flags: list[Any], given: list[Any]):
        super().__init__(n_rows, keys, values, flags)
        self._given = given

    def records(self) -> list[dict[str, Any]]:
        """The records as dicts, each key a record has: its number, or None."""
        out: list[dict[str, Any]] = [{} for _ in range(self.n_rows)]
        for name, values, flags, given in zip(self.keys, self._values, self._flags, self._given):
            for r in given.nonzero()[0].tolist():
                out[r][name] = float(values[r]) if flags[r] else None
        return out
