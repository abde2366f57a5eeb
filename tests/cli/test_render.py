"""The JSON renderer's fast paths (the C encoder on the document as it is, msgspec laying out the
indentation) give exactly the text of the simple definition, json.dumps(strict(doc), indent=...)."""

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool.cli import render

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.floats(width=32).map(np.float32), st.integers(-(2**40), 2**40).map(np.int64),
    st.booleans().map(np.bool_))
_docs = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.lists(inner, max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=8), inner, max_size=5)), max_leaves=40)


def _reference(doc, indent):
    return json.dumps(render.strict(doc), allow_nan=False, indent=indent, ensure_ascii=False)


@settings(max_examples=300, deadline=None)
@given(doc=_docs, indent=st.sampled_from([None, 2, 4]), msgspec=st.booleans())
def test_dumps_json_is_the_simple_definition(doc, indent, msgspec):
    """With msgspec laying out every document (threshold 0), and without it."""
    if msgspec:
        pytest.importorskip("msgspec")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(render, "MSGSPEC_LAYOUT_BYTES", 0)
        if not msgspec:
            m.setattr(render, "_msgspec_layout", lambda: None)
        assert render.dumps_json(doc, indent=indent) == _reference(doc, indent)


def test_a_big_document_is_laid_out_by_msgspec_and_a_small_one_is_not(monkeypatch):
    pytest.importorskip("msgspec")
    calls = []
    real = render._msgspec_layout
    monkeypatch.setattr(render, "_msgspec_layout", lambda: calls.append(1) or real())
    monkeypatch.delitem(__import__("sys").modules, "msgspec", raising=False)
    small = {"tensors": [{"name": "w", "norm": 1.5}]}
    big = {"tensors": [{"name": f"t{i}", "norm": i / 7, "shape": [i, 3]} for i in range(10_000)]}
    assert render.dumps_json(small) == _reference(small, 2) and calls == []
    assert render.dumps_json(big) == _reference(big, 2) and calls == [1]


def test_non_finite_floats_and_numpy_scalars_are_still_strict():
    doc = {"a": float("nan"), "b": [float("inf"), -float("inf")], "c": np.float32(0.5), "d": (1, np.int64(2))}
    assert json.loads(render.dumps_json(doc)) == {"a": "NaN", "b": ["Infinity", "-Infinity"], "c": 0.5, "d": [1, 2]}


_ANSI = re.compile("\x1b\\[[0-9;]*m")

# Tables: rows padded by print_table when the table fits give exactly rich's own layout of the whole table.
_cell_text = st.one_of(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=10),
                       st.text(st.sampled_from(" a\xa0\u3000\u0301\u200b\u2003\t"), max_size=4))  # spaces
_table_values = st.one_of(_cell_text, st.none(), st.booleans(), st.integers(-10**6, 10**6),
                          st.floats(allow_nan=True, allow_infinity=True),
                          st.lists(st.integers(0, 5000), max_size=3).map(tuple))


def _rich_reference(title, columns, rows, right, console):
    """The table as rich lays it out row by row (what print_table drew before its fast path)."""
    from rich.text import Text

    if title:
        console.print(Text(title, style="bold"))
    justify = ["right" if c in right else "left" for c in columns]
    console.print(render._rich_table(columns, justify, [[render.human(v) for v in r] for r in rows]))


def _console(width, terminal):
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), markup=False, highlight=False, emoji=False, width=width, soft_wrap=False,
                   force_terminal=terminal, color_system="standard" if terminal else None)


@settings(max_examples=1000, deadline=None)
@given(data=st.data(), ncols=st.integers(1, 5), nrows=st.integers(0, 6), width=st.sampled_from([20, 60, 200]),
       terminal=st.booleans(), title=st.sampled_from([None, "a title"]))
def test_print_table_is_richs_layout(data, ncols, nrows, width, terminal, title):
    """Any cells (wide and combining characters, spaces at the ends, control characters, empty), in a
    terminal (bold heading) or not: a table that fits the width is rich's layout of it, escape codes
    included; a wider one is rich's layout on a console wide enough for it (no cell folded), the same
    text but for the heading's escape codes; one with a control or zero-width character, rich's own."""
    columns = data.draw(st.lists(st.text(st.characters(codec="ascii", min_codepoint=33), min_size=1, max_size=8),
                                 min_size=ncols, max_size=ncols, unique=True))
    rows = data.draw(st.lists(st.lists(_table_values, min_size=ncols, max_size=ncols), min_size=nrows,
                              max_size=nrows))
    right = data.draw(st.lists(st.sampled_from(columns), max_size=ncols))
    widths = render._natural_widths(columns, [[render.human(v) for v in r] for r in rows])
    wide = widths is not None and sum(widths) + 2 * len(widths) - 2 > width
    fast = _console(width, terminal)
    reference = _console(10_000, False) if wide else _console(width, terminal)
    render.print_table(title, columns, rows, right=right, out=fast)
    _rich_reference(title, columns, rows, right, reference)
    got = _ANSI.sub("", fast.file.getvalue()) if wide else fast.file.getvalue()
    assert got == reference.file.getvalue()
    if wide and terminal:
        assert fast.file.getvalue().splitlines()[1 if title else 0].startswith("\x1b[1m")  # a bold heading



def test_a_table_is_padded_here_whatever_its_width(monkeypatch):
    padded = []
    real = render._padded_row
    monkeypatch.setattr(render, "_padded_row", lambda *a: padded.append(a[0]) or real(*a))
    rows = [["encoder.attn.weight", 1.5], ["b", float("nan")]]
    wide, narrow = _console(80, False), _console(12, False)
    render.print_table(None, ["tensor", "norm"], rows, right=["norm"], out=wide)
    assert padded == [["encoder.attn.weight", "1.5"], ["b", "NaN"]]
    assert wide.file.getvalue().splitlines() == ["tensor               norm",
                                                 "encoder.attn.weight   1.5",
                                                 "b                     NaN"]
    render.print_table(None, ["tensor", "norm"], rows, right=["norm"], out=narrow)  # wider than 12: as it is
    assert padded[2:] == [["tensor", "norm"]] + padded[:2]  # the heading too
    assert narrow.file.getvalue() == wide.file.getvalue()
    render.print_table(None, ["tensor"], [["a\x1b[31mb"]], out=wide)
    assert len(padded) == 5  # a control character: rich draws it


@pytest.mark.parametrize("rows,right", [([["\xa0", ""]], ["0"]), ([["", "0\u0300\u2000"]], []),
                                        ([["a ", "b\u3000"]], ["0", "00"]), ([["0\u200b\u3000", ""]], ["0"])])
def test_trailing_whitespace_and_zero_width_characters_as_rich_draws_them(rows, right):
    """Found by the property test: rich strips a right-justified cell's trailing whitespace, and crops a
    cell's by its count of characters (so where a combining character makes that exceed the width)."""
    fast, reference = _console(20, False), _console(20, False)
    render.print_table(None, ["0", "00"], rows, right=right, out=fast)
    _rich_reference(None, ["0", "00"], rows, right, reference)
    assert fast.file.getvalue() == reference.file.getvalue()


@pytest.mark.parametrize("heading", ["\x7f", "a\x1b", "e\u0301"])
@pytest.mark.parametrize("right", [False, True])
def test_a_heading_with_a_control_or_zero_width_character_is_drawn_by_rich(heading, right):
    """Found by the property test above: under a heading holding DEL, an empty cell was padded by
    gradtool (to the heading's one cell) where rich pads it to two."""
    fast, reference = _console(60, False), _console(60, False)
    render.print_table(None, [heading], [[""]], right=[heading] if right else [], out=fast)
    _rich_reference(None, [heading], [[""]], [heading] if right else [], reference)
    assert fast.file.getvalue() == reference.file.getvalue()


# Off a terminal, PlainConsole writes what rich's Console would, without importing rich.
_line_text = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
    st.text(st.sampled_from(" a~\t\x1b\x7f\u3000\u0301" + "".join(sorted(render.NARROW_SYMBOLS))), max_size=30),
    st.integers(0, 260).map(lambda n: ("ab c" * 70)[:n]))  # around the width: rich wraps past it


def _plain_and_rich(width):
    import io

    return render.PlainConsole(io.StringIO(), width), _console(width, False)


@settings(max_examples=1000, deadline=None)
@given(text=_line_text, width=st.sampled_from([8, 80, 200]), soft_wrap=st.booleans(),
       style=st.sampled_from([None, "bold"]))
def test_plain_console_prints_a_line_as_rich_does(text, width, soft_wrap, style):
    """Any line (wider than the console, tabs, control, wide and combining characters, the charts'
    symbols), wrapped or not, styled or not: PlainConsole's output is rich's non-terminal output."""
    from rich.text import Text

    plain, rich = _plain_and_rich(width)
    render._print_text(plain, text, style, soft_wrap)
    rich.print(Text(text, style=style), soft_wrap=soft_wrap)
    assert plain.file.getvalue() == rich.file.getvalue()


@settings(max_examples=500, deadline=None)
@given(data=st.data(), ncols=st.integers(1, 4), nrows=st.integers(0, 4), width=st.sampled_from([20, 200]),
       title=st.sampled_from([None, "a title", "a\ttitle", "τ•"]))
def test_plain_console_prints_a_table_as_rich_does(data, ncols, nrows, width, title):
    """print_table on a PlainConsole gives rich's non-terminal console's text, whatever the cells (the
    heading written here when it fits, by rich when a cell holds what only rich lays out)."""
    heading = st.one_of(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6),
                        st.text(st.sampled_from("a •─┤τ\t"), min_size=1, max_size=6))
    columns = data.draw(st.lists(heading, min_size=ncols, max_size=ncols, unique=True))
    rows = data.draw(st.lists(st.lists(_table_values, min_size=ncols, max_size=ncols), min_size=nrows,
                              max_size=nrows))
    right = data.draw(st.lists(st.sampled_from(columns), max_size=ncols))
    plain, rich = _plain_and_rich(width)
    render.print_table(title, columns, rows, right=right, out=plain)
    render.print_table(title, columns, rows, right=right, out=rich)
    assert plain.file.getvalue() == rich.file.getvalue()


def test_plain_console_empty_line_and_rich_objects():
    from rich.table import Table

    plain, rich = _plain_and_rich(80)
    for out in (plain, rich):
        out.print()
        out.print(end="")
        table = Table("a", "b")
        table.add_row("1", "2")
        out.print(table)
    assert plain.file.getvalue() == rich.file.getvalue()
    assert plain.file.getvalue().startswith("\n")
    copy = render.console_like(plain, plain.file)
    assert isinstance(copy, render.PlainConsole) and copy.width == 80


def test_the_charts_symbols_are_one_cell_each_for_rich():
    from rich.cells import cell_len

    assert {c: cell_len(c) for c in render.NARROW_SYMBOLS} == {c: 1 for c in render.NARROW_SYMBOLS}


class _Stream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty

    def write(self, text):
        return len(text)

    def flush(self):
        pass


@pytest.mark.parametrize("tty,env,plain", [
    (False, {}, True), (True, {}, False), (False, {"FORCE_COLOR": "1"}, False), (False, {"FORCE_COLOR": ""}, True),
    (False, {"TTY_COMPATIBLE": "1"}, False), (False, {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"}, True),
    (False, {"TTY_COMPATIBLE": "x", "FORCE_COLOR": "1"}, False)])
def test_console_is_plain_exactly_where_rich_would_not_see_a_terminal(monkeypatch, tty, env, plain):
    """rich's own rule (its Console.is_terminal): TTY_COMPATIBLE 0 or 1 decides, else FORCE_COLOR set and
    not empty, else the stream's isatty."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stream = _Stream(tty)
    monkeypatch.setattr("sys.stdout", stream)
    out = render.console()
    assert isinstance(out, render.PlainConsole) == plain
    if not tty:
        assert out.width == render.PIPED_WIDTH
        assert out.is_terminal == render.rich_console(stream, render.PIPED_WIDTH).is_terminal
