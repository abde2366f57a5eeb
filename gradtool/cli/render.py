"""The one renderer for every command: table (people), json / jsonl / csv / tsv (pipelines).

Data goes to stdout, messages and progress to stderr. JSON is strict: non-finite floats are written as the
strings "NaN", "Infinity" and "-Infinity" (and a statistic that does not exist, e.g. the mean of an empty
tensor, as null). CSV/TSV use the same spellings and an empty cell for null. Floats are printed in full
precision (Python's repr, which round-trips exactly), never rounded, except in tables.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice
from typing import Any, TextIO

FORMATS = ("table", "json", "jsonl", "csv", "tsv")
SPARK = "▁▂▃▄▅▆▇█"
NARROW_SYMBOLS = frozenset(SPARK + "•─┤τ")  # the non-ASCII characters gradtool draws: one cell each (tested)


def strict(value: Any) -> Any:
    """A JSON-safe copy: NaN/±inf floats become "NaN"/"Infinity"/"-Infinity"; tuples become lists."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return strict(value.item())
    return value


def dumps_json(doc: Any, *, indent: int | None = 2, of: int = 1) -> str:
    """``json.dumps(strict(doc), indent=indent)``, faster for big documents: the standard library's C
    encoder takes ``doc`` as it is unless it holds non-finite floats or non-JSON types (NumPy scalars),
    which ``strict`` rewrites first. Python's indenting encoder is pure Python (~50 ms per MB of text:
    36 ms for an 8-step GPT-2 history); past MSGSPEC_LAYOUT_BYTES of compact text, msgspec (the
    ``[speedups]`` extra) lays out the indentation instead (2 ms), when installed: below that, importing
    it (11 ms) costs more than it saves. ``of``: how many such texts the caller makes in all (blocks of
    one list), whose sizes count together. The text is the same either way (property-tested)."""
    try:
        compact = json.dumps(doc, allow_nan=False, ensure_ascii=False)
    except (ValueError, TypeError):
        doc = strict(doc)
        compact = json.dumps(doc, allow_nan=False, ensure_ascii=False)
    if indent is None:
        return compact
    layout = (_msgspec_layout() if len(compact) * of >= MSGSPEC_LAYOUT_BYTES or "msgspec" in sys.modules
              else None)
    if layout is None:
        return json.dumps(doc, allow_nan=False, indent=indent, ensure_ascii=False)
    return layout(compact.encode(), indent=indent).decode()


MSGSPEC_LAYOUT_BYTES = 256 << 10


def _msgspec_layout() -> Any:
    """``msgspec.json.format`` (it only re-spaces JSON text), or None without msgspec."""
    try:
        from msgspec.json import format as layout
    except ImportError:
        return None
    return layout


def cell(value: Any) -> str:
    """A CSV/TSV cell: full-precision floats, strict non-finite spellings, '' for None."""
    value = strict(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return repr(value) if isinstance(value, float) else str(value)


def write_json(doc: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    out.write(dumps_json(doc) + "\n")


def write_records(rows: Iterable[dict[str, Any]], columns: Sequence[str], fmt: str, out: TextIO | None = None,
                  *, header: bool = True) -> None:
    """jsonl: one JSON object per row; csv/tsv: a header (unless ``header`` is false) then one row per
    record."""
    out = out or sys.stdout
    if fmt == "jsonl":
        for r in rows:
            out.write(dumps_json({c: r.get(c) for c in columns}, indent=None) + "\n")
        return
    w = csv.writer(out, delimiter="\t" if fmt == "tsv" else ",", lineterminator="\n")
    if header:
        w.writerow(columns)
    for r in rows:
        w.writerow([cell(r.get(c)) for c in columns])


# Items encoded at a time: 2048 tensors' records held ~3 MB of dicts and ~6 MB of text copies at once
# (stats --format json of 20,000 tensors: 16 MB of its peak RSS went to the output)
ITEMS_PER_BLOCK = 256


def json_list_item(value: Any) -> str:
    """``value`` as :func:`dumps_json` lays it out inside a list that is a member of a top-level object
    (``{"key": [value, ...]}``): every line indented four more spaces, so that a document of many such
    items is written one item at a time, with :func:`json_document`, and reads as ``dumps_json``'s."""
    return "".join(json_list_item_parts(value))


def json_list_item_parts(value: Any) -> Iterator[str]:
    """:func:`json_list_item`'s text in parts, made as they are asked for. A dict whose last member is a
    sequence (a dump's tensors: any ``Sequence``, whose items may be made as they are asked for) has
    that sequence encoded ITEMS_PER_BLOCK items at a time, a part each, never all of them made or joined
    at once (20,000 tensors' records: ~30 MB of dicts and ~40 MB of text copies)."""
    last = next(reversed(value), None) if isinstance(value, dict) else None
    items = value[last] if last is not None else None
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)) or items == []:
        yield "    " + dumps_json(value).replace("\n", "\n    ")
        return
    head = json_list_item({**value, last: []})  # ... "tensors": []\n    }
    if not items:
        yield head
        return
    yield head[: -len("]\n    }")] + "\n"
    blocks = -(-len(items) // ITEMS_PER_BLOCK)
    for start in range(0, len(items), ITEMS_PER_BLOCK):
        # "[\n  {...},\n  {...}\n]"
        block = dumps_json(list(items[start: start + ITEMS_PER_BLOCK]), of=blocks)
        yield (",\n      " if start else "      ") + block[2:-2].replace("\n", "\n      ")
    yield "\n      ]\n    }"


def json_document(key: str, items: Iterable[str | Iterable[str]], rest: dict[str, Any], out: TextIO) -> None:
    """``write_json({key: [...], **rest})`` with the list's items given as :func:`json_list_item`
    texts (at least one), or their parts (:func:`json_list_item_parts`), written as they come."""
    out.write("{\n  " + json.dumps(key) + ": [\n")
    for k, item in enumerate(items):
        if k:
            out.write(",\n")
        for part in (item,) if isinstance(item, str) else item:
            out.write(part)
    out.write("\n  ]")
    for name, value in rest.items():
        text = dumps_json(value).replace("\n", "\n  ")
        out.write(",\n  " + json.dumps(name, ensure_ascii=False) + ": " + text)
    out.write("\n}\n")


class OrderedChunks:
    """Texts kept as they are made (in memory up to ``budget`` characters, then in a temporary file) and
    read back in any order: a history's output is made one dump at a time, in the order the dumps are
    read, and written in step order, which is known when the last is read (each dump's metadata may give
    its step), without holding every dump's statistics. A text may be given in parts (any iterable of
    str, taken one part at a time and never joined: a 20,000-tensor dump's JSON is ~9 MB, written to the
    file as it comes once the budget is spent) and read back in parts (:meth:`parts`)."""

    READ_BYTES = 1 << 20  # a part read back from the temporary file

    def __init__(self, budget: int = 2 << 20) -> None:
        self.budget = budget
        self._texts: list[list[str]] = []  # (until the budget is spent)
        self._held = 0
        self._file: Any = None  # then every text here, at self._where
        self._where: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self._where) if self._file is not None else len(self._texts)

    def add(self, text: str | Iterable[str]) -> None:
        parts = iter((text,) if isinstance(text, str) else text)
        if self._file is None:
            held: list[str] = []
            for part in parts:
                held.append(part)
                self._held += len(part)
                if self._held > self.budget:
                    break
            else:
                self._texts.append(held)
                return
            import tempfile

            try:
                self._file = tempfile.TemporaryFile()
            except OSError as exc:
                raise self._cannot(exc) from None
            texts, self._texts = self._texts, []
            for t in texts:
                self._write(t)
            parts = chain(held, parts)
            del held
        self._write(parts)

    def _write(self, parts: Iterable[str]) -> None:
        try:
            start = self._file.tell()
            for part in parts:
                self._file.write(part.encode("utf-8", "surrogatepass"))
            self._where.append((start, self._file.tell() - start))
        except OSError as exc:
            raise self._cannot(exc) from None

    @staticmethod
    def _cannot(exc: OSError) -> Exception:
        """The one-line error of a temporary file that cannot take the output (a full disk)."""
        import tempfile

        from ..errors import OutputError

        return OutputError(f"{tempfile.gettempdir()}: cannot keep the output until every step is read "
                           f"({exc.strerror or exc}); set TMPDIR to a directory with room")

    def __getitem__(self, i: int) -> str:
        return "".join(self.parts(i))

    def parts(self, i: int) -> Iterator[str]:
        """Text ``i``, in parts (as given, or READ_BYTES of the temporary file at a time)."""
        if self._file is None:
            yield from self._texts[i]
            return
        import codecs

        start, size = self._where[i]
        decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
        for at in range(start, start + size, self.READ_BYTES):
            self._file.seek(at)
            data = self._file.read(min(self.READ_BYTES, start + size - at))
            yield decoder.decode(data, final=at + len(data) >= start + size)
        self._file.seek(0, 2)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._texts = []


class RecordsOutput:
    """A report of one record per dump (``stats``' summaries, ``clip``'s changes) made one record at a
    time, as each dump is done: its JSON (:func:`json_list_item`), its rows (jsonl/csv/tsv: the record's
    ``where`` fields and each of its ``tensors``' ``fields``) or its table (``print_record(record, out)``)
    kept as text in :class:`OrderedChunks`, and of the record only its ``kept`` fields, so that a history
    of any length holds no dump's tensor statistics. :meth:`write` writes them when every record is in,
    in step order when ``by_step`` (stable; when every record has a step), else in the order they came;
    output cut short by an error is never begun. ``tables``: each record's table is shown ("all"), or
    only that of a record that stays the only one ("lone"), or none ("none")."""

    def __init__(self, fmt: str, where: Sequence[str], fields: Sequence[str], kept: Sequence[str],
                 print_record: Any, *, tables: str = "lone", by_step: bool = True, stream: TextIO | None = None):
        self.fmt, self.where, self.fields, self.kept = fmt, list(where), list(fields), list(kept)
        self.print_record, self.tables, self.by_step = print_record, tables, by_step
        self.stream = stream or sys.stdout
        self.records: list[dict[str, Any]] = []  # each record's kept fields, in the order they came
        self.chunks = OrderedChunks()
        self.lone: dict[str, Any] | None = None  # ("lone": the first record, while it is the only one)
        self.out = console(stderr=self.stream is sys.stderr) if fmt == "table" else None

    def __enter__(self) -> RecordsOutput:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.chunks.close()

    def add(self, record: dict[str, Any]) -> None:
        """A dump's record, its step final."""
        import io

        self.records.append({k: record[k] for k in self.kept})
        text = io.StringIO()
        if self.fmt == "json":
            self.chunks.add(json_list_item_parts(record))
        elif self.fmt in ("jsonl", "csv", "tsv"):
            self.chunks.add(self._rows_text(record))
        elif self.tables == "all":
            self.print_record(record, console_like(self.out, text))
            self.chunks.add(text.getvalue())
        elif self.tables == "lone":
            self.lone = record if len(self.records) == 1 else None

    def _rows_text(self, record: dict[str, Any]) -> Iterator[str]:
        """The record's jsonl/csv/tsv rows, a part every ITEMS_PER_BLOCK of them (20,000 tensors' rows:
        ~9 MB of text), made as they are asked for."""
        import io

        where = {k: record[k] for k in self.where}
        rows = iter(record["tensors"])
        while block := list(islice(rows, ITEMS_PER_BLOCK)):
            text = io.StringIO()
            write_records(({**where, **t} for t in block), self.where + self.fields, self.fmt, text,
                          header=False)
            yield text.getvalue()

    def shows_tensors(self) -> bool:
        """Whether the next record's ``tensors`` are shown (False: a table that shows no tensor of it)."""
        return self.fmt != "table" or self.tables == "all" or (self.tables == "lone" and not self.records)

    def order(self) -> list[int]:
        """The records' places in the output."""
        steps = [r.get("step") for r in self.records]
        if not self.by_step or None in steps:
            return list(range(len(steps)))
        return sorted(range(len(steps)), key=steps.__getitem__)

    def in_order(self) -> list[dict[str, Any]]:
        """The records' kept fields, in the output's order."""
        return [self.records[i] for i in self.order()]

    def write(self, skipped: list | None = None) -> None:
        """The records' JSON document (with ``skipped``), rows, or tables."""
        order = self.order()
        if self.fmt == "json":
            json_document("dumps", (self.chunks.parts(i) for i in order), {"skipped": list(skipped or [])},
                          self.stream)
            return
        if self.fmt in ("jsonl", "csv", "tsv"):
            write_records([], self.where + self.fields, self.fmt, self.stream)  # (csv, tsv: the header)
        elif self.lone is not None:
            self.print_record(self.lone, self.out)
            return
        stream = self.stream if self.out is None else self.out.file
        for i in order if len(self.chunks) else ():
            for part in self.chunks.parts(i):
                stream.write(part)


def human(value: Any) -> str:
    """A compact cell for tables (6 significant digits)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


PIPED_WIDTH = 200  # the width of a table or a line written to a file or a pipe (rich's default 80 would fold it)


def console(stderr: bool = False) -> Any:
    """Where a command's table or lines go: stdout (or stderr). To a terminal (or one that rich is told
    is a terminal: ``FORCE_COLOR``, ``TTY_COMPATIBLE=1``), rich's Console at the terminal's width; to a
    file or a pipe, a :class:`PlainConsole` of :data:`PIPED_WIDTH` columns, which writes what rich would
    without importing it."""
    stream = sys.stderr if stderr else sys.stdout
    if not stream.isatty() and not _terminal_by_environment():
        return PlainConsole(stream, PIPED_WIDTH)
    return rich_console(stream, None if stream.isatty() else PIPED_WIDTH)


def rich_console(stream: TextIO, width: int | None) -> Any:
    """rich's Console on ``stream`` with markup, highlighting and emoji codes off (user data prints as
    itself), ``width`` columns (None: the terminal's)."""
    from rich.console import Console

    return Console(file=stream, markup=False, highlight=False, emoji=False, width=width, soft_wrap=False)


def _terminal_by_environment() -> bool:
    """Whether rich would take a stream that is not a terminal for one, by its environment variables:
    ``TTY_COMPATIBLE=1``, or ``FORCE_COLOR`` set and not empty (and ``TTY_COMPATIBLE`` not 0)."""
    import os

    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    return os.environ.get("FORCE_COLOR", "") != ""


class PlainConsole:
    """rich's Console writing to a file or a pipe, for what gradtool prints there, without rich: plain
    lines and table headings as they are (the ~15 ms of importing rich were 5 % of a 500 MB ``clip`` and
    more of a small ``stats``). A line rich would lay out its own way (wider than ``width``, which rich
    wraps; a tab, which it expands; a control or non-ASCII character, which it measures by cells) and
    any rich object are left to rich's Console, made when first needed: the output is rich's either way
    (property-tested)."""

    is_terminal = False
    color_system = None

    def __init__(self, file: TextIO, width: int) -> None:
        self.file, self.width = file, width
        self._rich: Any = None

    def print(self, *objects: Any, **options: Any) -> None:
        """rich's ``Console.print``: an empty line for no objects, else rich's rendering of them."""
        if not objects and not options:
            self.file.write("\n")
            return
        self.rich().print(*objects, **options)

    def print_text(self, text: str, style: str | None = None, soft_wrap: bool = False) -> None:
        """``print(Text(text, style=style), soft_wrap=soft_wrap)``: plain text, unstyled off a terminal,
        written as it is when rich would write it so."""
        if _plain(text) and (soft_wrap or len(text) <= self.width):
            self.file.write(text + "\n")
            return
        from rich.text import Text

        self.rich().print(Text(text, style=style), soft_wrap=soft_wrap)

    def rich(self) -> Any:
        """rich's Console on the same file and width."""
        if self._rich is None:
            self._rich = rich_console(self.file, self.width)
        return self._rich


def _plain(text: str) -> bool:
    """Whether ``text`` is one cell a character and nothing rich lays out its own way: printable ASCII
    (no tab) and the symbols of gradtool's charts."""
    return (text.isascii() and text.isprintable()) or all(c in NARROW_SYMBOLS or " " <= c <= "~" for c in text)


def console_like(out: Any, file: TextIO) -> Any:
    """A console that writes to ``file`` what ``out`` (a :func:`console`) would print: the same width,
    colours and terminal styles."""
    if isinstance(out, PlainConsole):
        return PlainConsole(file, out.width)
    from rich.console import Console

    return Console(file=file, markup=False, highlight=False, emoji=False, width=out.width, soft_wrap=False,
                   force_terminal=out.is_terminal, color_system=out.color_system)


def _print_text(out: Any, text: str, style: str | None = None, soft_wrap: bool = False) -> None:
    """``text`` (in ``style``) on ``out``, a rich Console or a :class:`PlainConsole`."""
    if isinstance(out, PlainConsole):
        out.print_text(text, style, soft_wrap)
        return
    from rich.text import Text

    out.print(Text(text, style=style), soft_wrap=soft_wrap)


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
                right: Sequence[str] = (), out: Any = None) -> None:
    """A rich table with markup off: user data (tensor names like ``attn[weight]``) prints as itself.

    Every column is as wide as its widest cell, one space either side of a column, none at the edges, as
    rich draws a table that fits. Laying a table out row by row costs rich ~0.5 ms a row (0.35 s of the
    0.6 s ``gradtool stats`` took on a 592-tensor dump; seconds for tens of thousands of tensors), so rich
    draws only the heading, with those widths, and the rows are padded here: the same text, styles
    included (tested against rich's own layout). A table wider than the terminal is printed the same way
    at full width, the heading too (bold on a terminal): lines longer than the terminal, which it wraps
    (``less -S`` chops them), where rich would fold every cell into its share of the width, numbers
    broken across lines ("float3" over "2"), at 3 s for 592 rows on 80 columns. A cell holding a control
    or zero-width character leaves the whole table to rich."""
    out = out or console()
    if title:
        _print_text(out, title, "bold")
    cells = [[human(v) for v in r] for r in rows]
    justify = ["right" if c in right else "left" for c in columns]
    widths = _natural_widths(columns, cells)
    if widths is None:
        out.print(_rich_table(columns, justify, cells))
        return
    if sum(widths) + 2 * len(widths) - 2 > out.width:
        _print_text(out, _padded_row(columns, widths, justify)[:-1], "bold", soft_wrap=True)
    elif isinstance(out, PlainConsole):
        out.file.write(_padded_row(columns, widths, justify))  # rich's heading of these widths (tested)
    else:
        out.print(_rich_table(columns, justify, [], widths))
    if cells:
        out.file.write("".join(_padded_row(r, widths, justify) for r in cells))


def _rich_table(columns: Sequence[str], justify: Sequence[str], cells: list[list[str]],
                widths: Sequence[int] | None = None) -> Any:
    """rich's table of ``cells`` under ``columns`` (each of width ``widths[i]`` when given)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for i, c in enumerate(columns):
        table.add_column(c, justify=justify[i], overflow="fold", width=None if widths is None else widths[i])
    for r in cells:
        table.add_row(*[Text(v) for v in r])
    return table


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _natural_widths(columns: Sequence[str], cells: list[list[str]]) -> list[int] | None:
    """Each column's width in terminal cells (its widest cell or heading); None when a cell or a heading
    holds a control character, or a character of no width (combining, zero-width: rich crops the cell's
    trailing whitespace by its count of characters, not of cells): rich draws those its own way."""
    widths = []
    for c in columns:
        n = _cells(c)
        if n is None:
            return None
        widths.append(n)
    for r in cells:
        for i, v in enumerate(r):
            n = _cells(v)
            if n is None:
                return None
            if n > widths[i]:
                widths[i] = n
    return widths


def _cells(text: str) -> int | None:
    """``text``'s width in terminal cells; None when it holds a control or zero-width character."""
    n = _cell_len(text)
    return None if n < len(text) or _CONTROL.search(text) else n


def _cell_len(text: str) -> int:
    """``text``'s width in terminal cells, as rich counts them."""
    if text.isascii() and text.isprintable():  # a cell a character (numbers, names): no rich call (20,000
        return len(text)  # rows of a clip report: 0.16 -> 0.03 s)
    from rich.cells import cell_len

    return cell_len(text)


def _padded_row(row: Sequence[str], widths: Sequence[int], justify: Sequence[str]) -> str:
    """One table line as rich draws it: each cell padded to its column's width, left justified as it is,
    right justified without its trailing whitespace (rich's Lines.justify strips it), columns two spaces
    apart, none at the edges (pad_edge=False), the line's trailing spaces kept."""
    parts = []
    for v, w, j in zip(row, widths, justify):
        if j == "right":
            v = v.rstrip()
        n = _cell_len(v)
        parts.append(" " * (w - n) + v if j == "right" else v + " " * (w - n))
    return "  ".join(parts) + "\n"


def print_line(text: str, out: Any = None) -> None:
    _print_text(out or console(), text)


def sparkline(values: Sequence[float], *, width: int = 80, log: bool = True) -> str:
    """A one-line picture of a series (log scale by default); non-finite points show as '!'."""
    if not values:
        return ""
    if len(values) > width:  # keep the maximum of each bucket: spikes must stay visible
        step = len(values) / width
        buckets = [values[int(i * step): max(int((i + 1) * step), int(i * step) + 1)] for i in range(width)]
        values = [math.nan if any(not math.isfinite(v) for v in b) else max(b) for b in buckets]
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not finite:
        return "!" * len(values)
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    lo, hi = f(min(finite)), f(max(finite))
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append("!")
        elif log and v <= 0:
            out.append(" ")
        else:
            k = 0 if hi == lo else int((f(v) - lo) / (hi - lo) * (len(SPARK) - 1) + 0.5)
            out.append(SPARK[k])
    return "".join(out)
