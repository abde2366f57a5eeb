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
    table = dict_lines._DictTemplate.table(text)
    records, keys, notes = dict_lines._general_records(text, None)
    if table is None:
        return
    items, got_keys, got_notes = dict_lines._template_records(table, None)
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


# ---- a large console read from the bytes of its file (read_mapped_dict_lines) ---------------------------

# bytes spliced into a console anywhere (into characters and dict lines too): invalid UTF-8 (a lone
# continuation byte 0x85, which is no break; sequences cut short; an encoded surrogate), and characters
# of every width, the breaks of more than one byte among them
_JUNK = st.sampled_from([b"\xff", b"\x85", b"\xc2", b"\xc2\x85", b"\xe2\x80", b"\xe2\x80\xa8",
                         b"\xe2\x80\xa9", b"\xf0\x9f\x9a", "\U0001f680".encode(), "\u2588".encode(), b"\xed\xa0\x80",
                         b"\r\n", b"\r", b"{", b"\xe9"])


@st.composite
def _console_bytes(draw):
    data = draw(_console()).encode()
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(_JUNK) + data[at:]
    return draw(st.sampled_from([b"", b"", b"\xef\xbb\xbf", "wandb: \U0001f680 View run\n".encode()])) + data


def _decoded(data):
    return data.decode("utf-8", "replace")


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(data=_console_bytes())
@example(data=b"{'grad_norm': 1.5}\xc2\x85{'grad_norm': 2.5}\x85{'grad_norm': 3.5}\xe2\x80\xa9x{\n")
@example(data=b"{'grad_norm': 1.5}\xe2\x80\xa9x\n{'grad_norm': 2.5}\xe2\x80\xa8{'a': 1}\n"
              b"{'grad_norm': 3.5}\xc2\x85\n")
def test_the_compiled_reader_reads_utf8_bytes_as_their_decoded_text(data):
    """dict_lines of UTF-8 bytes reads the lines of the text they decode to (invalid bytes replaced) as
    dict_lines of that text does: the same values, and each stop the same place (as decoded text), the
    line stopped at skipped by _utf8_line_end and _line_end alike."""
    text = _decoded(data)
    template = dict_lines._DictTemplate._first(dict_lines._newline_lines(text))
    if template is None or template.ops is None:
        return
    pos_b = pos_s = 0
    while pos_s < len(text):
        out_b, out_s = [bytearray() for _ in template.keys], [bytearray() for _ in template.keys]
        pos_b, rows_b = _COMPILED.dict_lines(template.ops, data, pos_b, out_b)
        pos_s, rows_s = _COMPILED.dict_lines(template.ops, text, pos_s, out_s)
        assert (_decoded(data[:pos_b]), rows_b, out_b) == (text[:pos_s], rows_s, out_s)
        pos_b, pos_s = dict_lines._utf8_line_end(data, pos_b), dict_lines._line_end(text, pos_s)
        assert _decoded(data[:pos_b]) == text[:pos_s]
    assert pos_b == len(data)


@settings(max_examples=300, deadline=None)
@given(data=_console_bytes(), at=st.integers(0, 400))
def test_a_line_end_found_in_utf8_bytes_is_one_of_the_decoded_text(data, at):
    """From any byte, even inside a character: the end of a break of the decoded text (its bytes decode
    to a prefix of it ending in a break), and from a character's first byte that character's line's."""
    text, end = _decoded(data), dict_lines._utf8_line_end(data, at)
    head = _decoded(data[:end])
    assert text.startswith(head)
    assert end == len(data) or dict_lines._LINE_BREAK.fullmatch(head[-1])
    if at <= len(data) and len(_decoded(data[:at]) + _decoded(data[at:])) == len(text):  # a character starts
        assert len(head) == dict_lines._line_end(text, len(_decoded(data[:at])))  # at byte at


def _mapped_every_size(mp):
    from gradtool.io import logs

    mp.setattr(logs, "_MAP_LOG_BYTES", 1)  # (else only logs of 16 MiB and more)


def _kernels(mp, compiled):
    """The compiled readers on (as they are) or off, for the test's ``mp`` context."""
    if not compiled:
        mp.setenv("GRADTOOL_NO_KERNELS", "1")


@settings(max_examples=400, deadline=None)
@given(data=_console_bytes(), block=st.sampled_from([1, 7, 64, 1 << 22]), compiled=st.booleans())
@example(data=b"\xef\xbb\xbf{'grad_norm': 1.5, 'loss': 1}\n" * 3, block=1 << 22, compiled=True)
@example(data=("\U0001f680" * 20 + "\n{'grad_norm': 1.5}\n").encode(), block=7,
         compiled=True)  # a template past block 7
@example(data=("{'grad_norm': 1.5}\n" + "\u2588" * 70_000 + "\n{'grad_norm': 2.5}\n").encode(),
         block=1 << 16, compiled=True)  # the line of character 2^16 ends past 2^16 + 64 Ki bytes: decoded
def test_a_console_read_from_its_bytes_is_read_as_its_text(tmp_path_factory, data, block, compiled):
    """read_mapped_dict_lines gives read_dict_lines' history of the decoded text (or the same error), or
    declines (None) where it does not apply: without a template in the first block, for fairseq's
    console, when the text has no norm, or when the first block's last line does not end in the bytes
    decoded for it. With the compiled reader, or without it (the lines read a block of bytes at a time)."""
    with pytest.MonkeyPatch.context() as mp:
        _mapped_every_size(mp)
        _kernels(mp, compiled)
        mp.setattr(dict_lines._DictTemplate, "BLOCK", block)
        _same_from_bytes_as_from_text(tmp_path_factory, data, block)


def _same_from_bytes_as_from_text(tmp_path_factory, data, block):
    from gradtool.io.logs import _read_text, utf8_text_start

    path = tmp_path_factory.mktemp("m") / "console.log"
    path.write_bytes(data)
    text = _read_text(str(path))
    try:
        want = dict_lines.read_dict_lines(str(path), None, text)
    except Exception as exc:
        with pytest.raises(type(exc)):
            dict_lines.read_mapped_dict_lines(str(path), None, str(path), lambda head, whole: True)
        return
    got = dict_lines.read_mapped_dict_lines(str(path), None, str(path), lambda head, whole: True)
    if got is not None:
        _same_history(got, want)
        return
    head = text[:dict_lines._line_end(text, block)]
    first = dict_lines._DictTemplate._first(dict_lines._newline_lines(head))
    assert (first is None or dict_lines.is_fairseq(text) or want is None
            or dict_lines._utf8_head(data, utf8_text_start(data), block) is None), text


# how a log may open before a console's dict lines: each kind _read_norm_log tells by its first line
_OPENINGS = st.sampled_from([
    "", "", "  \n", "{'loss': 2.0, 'grad_norm': 1.5}\n", "{ 'grad_norm': 1.5}\n", "[rank0]: step 1\n",
    '[{"grad_norm": 1.5}]\n', '{"grad_norm": 1.5, "loss": 2.0}\n', '{"it\'s": 1}\n', "1700000000000 1.5 0\n",
    "step,grad_norm\n", "2024 | INFO | fairseq | epoch 001 | train_inner | \n",
    "epoch 001: | train_inner | {'num_updates': 1}\n", "{\n", "\r 10%|\u2588 | 1/10\r", '{"log_history": [',
])


@settings(max_examples=300, deadline=None)
@given(opening=_OPENINGS, data=_console_bytes(),
       name=st.sampled_from(["train.log", "metrics.csv", "out.txt"]), compiled=st.booleans())
def test_a_large_log_is_read_the_same_from_its_bytes_or_its_text(tmp_path_factory, opening, data, name,
                                                                   compiled):
    """read_norm_log of a log its reading from bytes takes (a console of dict lines; forced here for every
    size) gives what its reading of the decoded text gives: the same history, or the same error."""
    from gradtool.io import logs
    from gradtool.io.logs import read_norm_log

    path = tmp_path_factory.mktemp("o") / name
    path.write_bytes(opening.encode() + data)

    def read():
        try:
            return read_norm_log(str(path)), None
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}"

    with pytest.MonkeyPatch.context() as mp:
        _kernels(mp, compiled)
        mp.setattr(logs, "_MAP_LOG_BYTES", 1 << 62)  # no log is mapped: all decoded
        want, want_error = read()
        _mapped_every_size(mp)
        got, error = read()
    assert error == want_error
    if want is not None:
        _same_history(got, want)


@pytest.mark.parametrize("data, start", [
    (b"{'grad_norm': 1.5}\n" * 4, 0), (b"\xef\xbb\xbf{'grad_norm': 1.5}\n", 3),
    (b"\xff\xfe{\x00'\x00", None), (b"\xfe\xff\x00{\x00'", None),  # UTF-16: decoded as such
    (b"{'grad_norm': 1.5}\x00\n", None), (b"\x80\x04\x95{'grad_norm': 1.5}\n", None),  # binary, a pickle
    (__import__("gzip").compress(b"{'grad_norm': 1.5}\n"), None), (b"", None),  # compressed, empty
])
def test_which_logs_are_mapped_as_utf8(tmp_path, data, start):
    """mapped_utf8_log maps a regular file of UTF-8 text (its text after its byte order mark); others are
    left to the reading that decodes them or says what they are."""
    from gradtool.io import logs

    p = tmp_path / "train.log"
    p.write_bytes(data)
    with pytest.MonkeyPatch.context() as mp:
        _mapped_every_size(mp)
        with logs.mapped_utf8_log(str(p)) as mapped:
            assert (mapped and mapped[1]) == start and (mapped is None or bytes(mapped[0]) == data)
        with logs.mapped_utf8_log(str(tmp_path)) as mapped:  # a directory
            assert mapped is None
    with logs.mapped_utf8_log(str(p)) as mapped:  # smaller than _MAP_LOG_BYTES
        assert mapped is None
