"""Console lines that end in a dict of metrics (gradtool/io/dict_lines.py): the template reader gives the
history the general reader gives (a dict a line, then from_records), on logs of the Trainer's lines among
others, across the template reader's blocks."""

import math
import os
import struct
from itertools import chain

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.io import dict_lines
from gradtool.io.compiled import log_readers
from gradtool.io.logs import _num, from_records, read_norm_log

_COMPILED = log_readers()
needs_compiled = pytest.mark.skipif(_COMPILED is None, reason="gradtool.io._logscan not built, or "
                                    "GRADTOOL_NO_KERNELS set")


def _general(path, key=None, text=None):
    """The history by the general reader alone: a dict a line, then from_records."""
    text = open(path, encoding="utf-8", newline="").read() if text is None else text
    records, keys, notes = dict_lines._general_records(text, key)
    hist = None if records is None else from_records(records, str(path), "console", key)
    return None if hist is None else dict_lines._console_history(hist, str(path), keys, notes)


def _exactly(v):
    return v if v is None else struct.pack("<d", v)


def _same_records(text):
    """The records the template reader reads are the general reader's, each value as _num reads it (NaN
    positive), each key a record has kept, the keys in the general reader's order."""
    read = dict_lines._template_records(text, None)
    records, keys, notes = dict_lines._general_records(text, None)
    if read is None:
        return
    items, got_keys, got_notes = read
    assert (list(got_keys), got_notes) == (list(keys), notes)
    assert (items is None) == (records is None)
    if items is not None:
        assert items.keys == list(dict.fromkeys(chain.from_iterable(records)))
        assert ([sorted((k, _exactly(v)) for k, v in r.items()) for r in items.records()]
                == [sorted((k, _exactly(_num(v))) for k, v in r.items()) for r in records])


def _same_history(got, want):
    if want is None or got is None:
        assert got is None and want is None, (got, want)
        return
    assert ((got.steps, repr(got.norms), repr(got.loss), repr(got.lr), got.notes, got.key, got.kind,
             got.line_order, repr(got.tensor_norms))
            == (want.steps, repr(want.norms), repr(want.loss), repr(want.lr), want.notes, want.key, want.kind,
                want.line_order, repr(want.tensor_norms)))


_TOKENS = st.one_of(  # values a template reads
    st.floats(allow_nan=False, width=64).map(repr), st.floats(1e-9, 1e3).map(lambda x: f"{x:.4g}"),
    st.floats(-1e30, 1e30).map(repr), st.integers(-10**20, 10**20).map(str),
    st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity", "None", "True", "1_000", "1e999", "-0.0",
                     ".5", "5.", "+1", "1e-400", "0x10", "abc", "'1.5'", '"2.5"', "''"]))
_VALUES = st.one_of(_TOKENS, _TOKENS, _TOKENS, _TOKENS, _TOKENS, _TOKENS, st.sampled_from(
    ["tensor(1.5, device='cuda:0')", "1.5 ", " 2", "'a b'", "1,5", "{", "}", "", "'1,5'", "'x' 'y'"]))
_KEYS = st.sampled_from(["loss", "grad_norm", "learning_rate", "epoch", "eval_loss", "step", "gnorm",
                         "train_runtime", "grad_norm/layer.0", "lr", "'quoted'", "a b", "grad_norm/\u0441\u043b\u043e\u0439"])


# the usual first, several times; then what makes no template (" , ": a value "2.3 " stripped; a brace
# before the dict; a text after it)
_SEPS = st.sampled_from([", ", ",", ",\t", ", ", ",", ",\t", " , "])
_PREFIXES = st.sampled_from(["", "  3%|#  | 3/100 [00:01<00:30]", "INFO: "] * 3 + ["{", "x}"])
_TAILS = st.sampled_from(["", " ", "\t"] * 3 + ["x", " \x1f"])


@st.composite
def _dict_line(draw, template, sep, prefix, tail):
    """A dict line; mostly of the log's ``template`` keys, ``sep``, ``prefix`` and ``tail``, values drawn."""
    usual = draw(st.integers(0, 5)) < 5  # (0, hypothesis' simplest: the usual line)
    keys = template if usual else draw(st.lists(_KEYS, min_size=0, max_size=5))
    pairs = [f"'{k}': {draw(_VALUES)}" for k in keys]
    if not usual:
        sep, prefix, tail = draw(_SEPS), draw(_PREFIXES), draw(_TAILS)
    return prefix + "{" + sep.join(pairs) + "}" + tail


_BREAK = st.sampled_from(["\n", "\n", "\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028"])
_OTHER = st.sampled_from(["", "***** Running training *****", "  5%|#  | 5/100", "grad_norm: 3.5",
                          "{'eval_loss': 2.1, 'epoch': 1.0}", "{'train_runtime': 12.5, 'epoch': 3.0}",
                          "{'loss': 2.0, 'grad_norm': 1.0, 'learning_rate': 5e-05, 'epoch': 0.0}"])
_HF = ["loss", "grad_norm", "learning_rate", "epoch"]


@st.composite
def _console(draw):
    template = draw(st.sampled_from([_HF, _HF, ["loss", "grad_norm"], ["grad_norm", "step"],
                                     ["grad_norm/\u0441\u043b\u043e\u0439", "grad_norm"]]))
    line = _dict_line(template, draw(_SEPS), draw(_PREFIXES), draw(_TAILS))
    lines = draw(st.lists(st.one_of(line, line, line, _OTHER), min_size=4, max_size=40))
    breaks = draw(st.lists(_BREAK, min_size=len(lines), max_size=len(lines)))
    return "".join(line + b for line, b in zip(lines, breaks)) + draw(st.sampled_from(["", "x", "{'loss': 1}"]))


def _hf_line(i, g, epoch):
    return f"{{'loss': {2.5 - i / 1000:.4g}, 'grad_norm': {g}, 'learning_rate': 5e-05, 'epoch': {epoch}}}"


@pytest.mark.parametrize("compiled", [pytest.param(True, marks=needs_compiled), False])
@settings(max_examples=400, deadline=None)
@given(text=_console(), block=st.sampled_from([1, 7, 64, 1 << 22]))
@example(text="{'loss': 2.0, 'grad_norm': 1.0, 'epoch': 0.5}\n{'loss': 2.0, 'grad_norm': 2.0, 'epoch': 0.1}\n"
              "{'eval_loss': 1.0, 'epoch': 0.1}\n", block=1 << 22)
@example(text="\u2588 {'grad_norm': 1.5}\n{'grad_norm': None}\n\n{'grad_norm': 1_0}\n{'grad_norm': -nan}\n"
              "x\n{'grad_norm': 2.5}  \n{'grad_norm': 1e400}\n", block=1 << 22)
@example(text="{'loss': 1.0, 'grad_norm': 1.0, 'epoch': 0.5}\n{'x': 1, 'grad_norm': 2.0, 'epoch': 0.1}\n"
              "{'loss': 1.0, 'grad_norm': 3.0, 'epoch': 0.2}\n", block=1 << 22)  # a restart: keys of the last
@example(text="{'loss': 1.0, 'grad_norm': 1.0, 'epoch': 0.5}\n{'x': 1, 'grad_norm': 2.0, 'epoch': 0.1}\n",
         block=1 << 22)  # training's records, in their order; none of the template's kept
def test_the_template_reader_gives_the_general_readers_history(tmp_path_factory, compiled, text, block):
    """With the compiled reader (the lines it reads, the others by the pattern) or without it, and with
    blocks of a few characters or of the default size."""
    path = tmp_path_factory.mktemp("d") / "console.log"
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    saved = dict_lines._DictTemplate.BLOCK, os.environ.get("GRADTOOL_NO_KERNELS")
    dict_lines._DictTemplate.BLOCK = block
    if not compiled:
        os.environ["GRADTOOL_NO_KERNELS"] = "1"
    try:
        try:
            want = _general(path)
        except Exception as exc:  # (an error the general reader raises, the template reader raises too)
            with pytest.raises(type(exc)):
                dict_lines.read_dict_lines(str(path), None, text)
            return
        _same_history(dict_lines.read_dict_lines(str(path), None, text), want)
        _same_records(text)
    finally:
        dict_lines._DictTemplate.BLOCK = saved[0]
        if saved[1] is None:
            os.environ.pop("GRADTOOL_NO_KERNELS", None)
        else:
            os.environ["GRADTOOL_NO_KERNELS"] = saved[1]


def test_the_trainers_lines_are_read_by_the_template(tmp_path):
    """The Trainer's console (progress bars between its dicts, an evaluation's dict, a NaN, a restart)
    is read by one template: the general reader reads only the lines it does not match."""
    lines = []
    for i in range(300):
        g = "nan" if i == 7 else f"{1 + (i % 9) / 10:.4g}"
        lines.append(f"\r 10%|#   | {i}/300 [00:01<00:09]" + _hf_line(i, g, round((i % 200) / 100, 2)))
        if i % 100 == 99:
            lines.append("{'eval_loss': 2.1, 'eval_runtime': 3.2, 'epoch': 1.0}")
    text = "\n".join(lines) + "\n"
    table = dict_lines._DictTemplate.table(text)
    assert table.template_keys == _HF and table.rows.size == 300 and len(table.others) == 3
    p = tmp_path / "train.log"
    p.write_text(text)
    h = read_norm_log(str(p))
    want = _general(p, text=text)
    _same_history(h, want)
    assert h.kind == "console" and h.steps == list(range(100))  # the epoch back to 0 at line 200: the last
    assert h.norms == [1 + ((200 + s) % 9) / 10 for s in range(100)]  # training's
    assert any("another training" in n or "start" in n for n in h.notes), h.notes


@pytest.mark.parametrize("line, keys", [
    ("{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}", _HF),
    ('{"gnorm": "3.4", "num_updates": "100"}', ["gnorm", "num_updates"]),
    ("  3%|#  | 3/100 {'grad_norm': nan}  ", ["grad_norm"]),
    # no template: the general reader's value is not the token (stripped, "tensor(" cut), a key twice,
    # no comma between pairs, no pair
    ("{'loss': 2.3 , 'grad_norm': 1.2}", None), ("{'grad_norm': tensor(1.2, device='cuda:0')}", None),
    ("{'grad_norm': 1.2, 'grad_norm': 1.3}", None), ("{'grad_norm': 1 'loss': 2}", None), ("{}", None),
    ("{'grad_norm': '1,2'}", None), ("{'grad_norm': 1.2}x", None),
])
def test_which_dicts_make_a_template(line, keys):
    template = dict_lines._DictTemplate.of(line)
    assert (template and template.keys) == keys
    if template is not None:  # the line itself is the template's, its values the general reader's
        rows = template.lines.findall(line)
        assert len(rows) == 1 and rows[0][-1] == ""
        assert dict(zip(keys, rows[0])) == dict_lines._record_of_line(line)


def test_floats_read_as_num_reads_them():
    for texts in (["1.5", "-nan", "NaN", "inf", "1_000", "abc", "None", "-0.0", "1e999", "0x1"],
                  ["-nan", "1.5", "-0.0"]):  # (words among them, or numbers alone: float() on them all)
        values, flags = dict_lines._floats(texts)
        assert len(values) == len(flags) == len(texts)
        for t, v, f in zip(texts, values.tolist(), flags.tolist()):
            want = _num(t)
            assert f == (want is not None)
            assert _exactly(v) == _exactly(math.nan if want is None else want)


def _scan(line_or_text, template_line=None):
    """What the compiled reader reads of a text by the template of ``template_line`` (its first line):
    (stop, rows, the values by column)."""
    text = line_or_text
    template = dict_lines._DictTemplate.of(template_line or text.split("\n")[0])
    out = [bytearray() for _ in template.keys]
    stop, rows = _COMPILED.dict_lines(template.ops, text, 0, out)
    return stop, rows, [struct.unpack(f"<{len(c) // 8}d", c) for c in out]


@needs_compiled
def test_the_compiled_reader_reads_the_template_lines_and_skips_lines_without_a_brace():
    line = "{'loss': 2.31, 'grad_norm': 1.2345678901234567, 'learning_rate': 4.999995e-05, 'epoch': 0.01}"
    bar = " 10%|\u2588\u2588        | 10/100 [00:01<00:09]"  # (a text of two-byte characters)
    text = "\n".join([line, bar, bar + line.replace("0.01", "0.02") + " \t", "", "no dict here", line]) + "\n"
    stop, rows, values = _scan(text, line)
    assert (stop, rows) == (len(text), 3)
    assert values == [(2.31,) * 3, (1.2345678901234567,) * 3, (4.999995e-05,) * 3, (0.01, 0.02, 0.01)]


@needs_compiled
@pytest.mark.parametrize("line", [
    "{'loss': 2.0, 'grad_norm': None}", "{'loss': 2.0, 'grad_norm': 1_000}", "{'loss': 2.0, 'grad_norm': -nan}",
    "{'loss': 2.0, 'grad_norm': .5}", "{'loss': 2.0, 'grad_norm': 1.5x}", "{'loss': 2.0, 'grad_norm': NaN}",
    "{'loss': 2.0, 'grad_norm': " + "1" * 70 + "}", "{'loss': 2.0, 'grad_norm': 1.5} x", "}{'loss': 2.0, 'grad_norm': 1.5}",
    "{'loss': 2.0, 'grad_norm': 1.5}}", "{'loss': 2.0,  'grad_norm': 1.5}", "{'Loss': 2.0, 'grad_norm': 1.5}",
    "{'loss': 2.0, 'grad_norm': 1.5", "{'loss': 2.0, 'grad_norm': \u0661}",
])
def test_the_compiled_reader_stops_at_a_line_it_does_not_read(line):
    # a value float() reads otherwise or not at all, another text, a line cut short: the Python reader's
    text = "{'loss': 1.0, 'grad_norm': 3.0}\n" + line + "\n{'loss': 1.0, 'grad_norm': 3.0}\n"
    stop, rows, _ = _scan(text)
    assert (stop, rows) == (text.index("\n") + 1, 1)


@needs_compiled
@settings(max_examples=1000, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=False).map(repr), st.floats(allow_nan=False).map(lambda x: f"{x:.17e}"),
                       st.from_regex(r"\A[-+]?[0-9]{1,25}(\.[0-9]{0,25})?([eE][-+]?[0-9]{1,4})?\Z"),
                       st.sampled_from(["nan", "inf", "-inf", "0", "-0", "-0.0", "1e-400", "1e400",
                                        "9007199254740993", "2.2250738585072011e-308", "4.9e-324"])))
def test_the_compiled_reader_reads_values_as_float_does(value):
    line = "{'grad_norm': " + value + ", 'loss': 1}"
    stop, rows, values = _scan(line, line)
    assert rows == 1 and stop == len(line)
    want = float(value)
    assert struct.pack("<d", values[0][0]) == struct.pack("<d", math.nan if want != want else want)


@needs_compiled
@pytest.mark.parametrize("ops, out", [
    (((3,),), []), (((1,),), [bytearray()]), (((0, "x"), (3,)), [bytearray()]), (((0, b"x"),), []),
    (((3,), (2, True, False, 0, False)), [bytearray(), bytearray()]), ((("3",),), [bytearray()]),
    (((3,),), [b""]), (((3,),), [bytearray(), bytearray()]),
])
def test_the_compiled_reader_refuses_malformed_ops(ops, out):
    # the ops of another template (text logs' spaces and slots), a value without its column, text as str
    with pytest.raises(ValueError, match="dict_lines: malformed ops or out"):
        _COMPILED.dict_lines(ops, "{'a': 1}\n", 0, out)
    assert _COMPILED.dict_lines(((0, b"'a': "), (3,), (0, b"}")), "{'a': 1}\n", 0, [bytearray()])[1] == 1
