"""The compiled JSON Lines reader (json_rows in gradtool/io/_logscan.c, through
gradtool.io.logs.json_columns): lines of flat objects of numbers read into one column per key. Where it
answers, its columns are what json.loads makes of each line (keys in first-seen order, ints exact, floats
to the bit, Trackio's "NaN"/"Infinity"/"-Infinity" strings as floats); for lines of such objects, however
spaced, it answers; and the histories of JSON Lines logs and Trackio rows read through it are the dict
path's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.errors import InputError, UsageError
from gradtool.io.compiled import log_readers
from gradtool.io.logs import _num

pytestmark = pytest.mark.skipif(log_readers() is None, reason="gradtool.io._logscan not built, or "
                                "GRADTOOL_NO_KERNELS set")

_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _reference(text: bytes):
    """(rows, keys, {key: [(repr of the value, flag) per row]}, keys of the first row) as json.loads reads
    each non-blank line; None when a line is not an object of numbers and Trackio's words (the compiled
    reader must then give up)."""
    docs = []
    for line in text.split(b"\n"):
        if not line.strip(b" \t\r"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        if type(doc) is not dict:
            return None
        docs.append(doc)
    keys = list(dict.fromkeys(k for d in docs for k in d))
    columns = {k: [] for k in keys}
    for d in docs:
        for k in keys:
            v = d.get(k, None)
            if k not in d:
                columns[k].append(("nan", 0))
            elif type(v) is int:
                columns[k].append((repr(float(v)), 2))
            elif type(v) is float:
                columns[k].append((repr(v), 1))
            elif type(v) is str and v in _WORDS:
                columns[k].append((repr(_WORDS[v]), 1))
            elif type(v) is str and _num(v) is None:  # a word: a time, a name (no number to _num)
                columns[k].append(("nan", 3))
            else:
                return None
    return len(docs), keys, columns, len(docs[0]) if docs else 0


def _compiled(text):
    got = log_readers().json_rows(text)
    return None if got is None else _compiled_table(got)


_KEYS = st.sampled_from(["step", "grad_norm", "loss", "lr", "train/global_step", "a b", "_step", "k\\\"q",
                         "\\u0041", "x\ty", "\u00e9", "Z" * 40])
_NUMBERS = st.one_of(
    st.integers(-10**17, 10**17).map(str), st.integers(-999, 999).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda x: f"{x:.9g}"),
    st.sampled_from(["-0", "0", "-0.0", "0.0", "01", "-01", "1.", ".5", "1e5", "1E+5", "1e-5", "1e400",
                     "-1e400", "4.9e-324", "2.4e-324", "2.2250738585072014e-308",
                     "0.1000000000000000055511151231257827", "123456789012345678901234567890",
                     "9007199254740993", "999999999999999", "1000000000000000", "NaN", "Infinity",
                     "-Infinity", "+1", "-", "1e", "0x10", "1_000", "nan", "inf"]))
_OTHERS = st.sampled_from(['"NaN"', '"Infinity"', '"-Infinity"', '"nan"', '"x"', '""', "true", "false",
                           "null", "[1]", '{"a":1}', '"Na\\u004e"', '"2024-01-01T10:00:00"', '"gpt2-run"',
                           '"fine"', '" 1.5 "', '"1_000"', '"-inf"', '"caf\u00e9"', '"a\\tb"', '"tab\there"',
                           '"x\x7f"', '"\\"x"', '"e"', '"1.5x"', '"1 5"', '" "', '"step"', '"Infinity "'])


@st.composite
def _lines(draw):
    """JSON Lines text as loggers and people write it: flat objects of numbers, spaced any way, now and then
    a value or line of another kind."""
    comma = draw(st.sampled_from([",", ", ", " ,", ",\t"]))
    colon = draw(st.sampled_from([":", ": ", " : "]))
    shared = draw(st.lists(_KEYS, min_size=1, max_size=5))
    out = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.integers(0, 19))
        if kind == 0:
            out.append(draw(st.sampled_from(["", "  ", "\r", "garbage", "[1, 2]", '{"a": 1', '{"a": 1}}',
                                             '{"a": 1} x', "{}", " { } ", '{"a": 1,}', "{,}"])))
            continue
        keys = shared if kind > 3 else draw(st.lists(_KEYS, max_size=5))
        values = [draw(_OTHERS if kind == 1 else _NUMBERS) for _ in keys]
        items = comma.join(f'"{k}"{colon}{v}' for k, v in zip(keys, values))
        space = draw(st.sampled_from(["", " ", "\t"])), draw(st.sampled_from(["", " "]))
        out.append(space[0] + "{" + items + "}" + space[1])
    return draw(st.sampled_from(["\n", "\r\n"])).join(out) + draw(st.sampled_from(["", "\n"]))


@settings(max_examples=400, deadline=None)
@given(_lines())
@example('{"a": 1, "a": 2.5}\n{"b": "NaN"}')  # a key given twice: its later value, its first place
@example('{"step": -0, "x": 1e400, "y": 2.4e-324}')
@example('{"s": 999999999999999}\n{"s": 1000000000000000}')  # 15 digits exact; 16: the decoders decide
@example('{"a": 01}')  # no JSON (a leading zero)
@example('{"a": -01}')
@example('{"a": 1} x')  # something after the object
@example('{"a": 1}}')
@example('{"a": 1} {"a": 2}')  # two objects on one line: no JSON
@example('{"t": "2024-01-01T10:00:00", "a": 1}\n{"a": 2, "t": "gpt2-run"}\n{"t": 3}')  # words: flag 3
@example('{"t": "fine"}')  # only characters float() may read: the decoders decide
@example('{"t": "1.5x", "u": "1 5"}')
@example('{"a": "1_000"}')  # strings float() reads, each character of its alphabet: the decoders decide
@example('{"a": " 1.5 "}')
@example('{"a": "infinity"}')
@example('{"a": "-Inf"}')
@example('{"a": "\\u0031"}')  # an escape: "1"
def test_where_the_compiled_reader_answers_its_columns_are_what_json_loads_reads(text):
    data = text.encode("utf-8")
    ref = _reference(data)
    got = _compiled(data)
    if got is not None:
        assert ref is not None and got == ref
    assert _compiled(text) == (got if text.isascii() else None)  # a str: read in place when ASCII


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(st.tuples(
    st.sampled_from(["step", "grad_norm", "loss", "a/b", "Z" * 30]),
    st.one_of(st.integers(-10**15 + 1, 10**15 - 1), st.floats(), st.sampled_from(list(_WORDS)))), max_size=6),
    min_size=1, max_size=20), spaced=st.booleans())
def test_lines_of_flat_objects_of_numbers_are_read(rows, spaced):
    """Objects of numbers (what json.dumps writes of them, NaN and all, or Trackio's words) are read by
    the compiled reader, not left to the decoders: the fast path is taken."""
    separators = (", ", ": ") if spaced else (",", ":")
    text = "\n".join(json.dumps(dict(r), separators=separators) for r in rows)
    ref = _reference(text.encode())
    assert ref is not None and _compiled(text) == ref


def test_too_many_keys_or_columns_larger_than_the_text_are_left_to_the_decoders():
    wide = "{" + ",".join(f'"k{i}":1' for i in range(65_537)) + "}"
    assert _compiled(wide) is None  # more than 65,536 keys
    assert _compiled(wide.replace(',"k65536":1', ""))[1][-1] == "k65535"  # 65,536: read (5,000 parameters
    # of a mixture of experts were left to the decoders at 4,096)
    sparse = "\n".join(['{"a":1}'] * 1000 + ["{" + ",".join(f'"k{i}":1' for i in range(40)) + "}"])
    assert _compiled(sparse) is None  # 41 columns of 1001 rows: more bytes than the text
    assert _compiled(sparse.rsplit("\n", 1)[0])[0] == 1000


# --- histories: the JSON Lines log and Trackio rows read through the columns are the dict path's --------
def _history(h):
    return (h.steps, [repr(v) for v in h.norms], [repr(v) for v in h.loss], [repr(v) for v in h.lr], h.key,
            h.other_keys, h.notes, repr(h.tensor_norms), repr(h.tensor_max_abs))


_LOG_KEYS = st.sampled_from(["step", "global_step", "grad_norm", "loss", "learning_rate", "eval_loss",
                             "grad_norm_clipped", "grad_2.0_norm/w", "grad_2.0_norm_total", "_step",
                             "grad_2.0_norm/v", "grad_inf_norm/w"])
_LOG_VALUES = st.one_of(st.integers(-3, 60), st.floats(width=32), st.floats(0, 10),
                        st.sampled_from(list(_WORDS)), st.integers(2**60, 2**62), st.floats(1e15, 1e17),
                        st.sampled_from(["2024-01-01T10:00:00", "run-7", "n/a", "", "1.5", " nan "]))


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.dictionaries(_LOG_KEYS, _LOG_VALUES, max_size=6), min_size=1, max_size=30),
       key=st.sampled_from([None, "grad_norm", "loss", "grad_2.0_norm_total"]))
@example(rows=[{"step": 1, "grad_norm": 1.0}, {"step": 0, "grad_norm": 2.0}, {"step": 1, "grad_norm": 3.0}],
         key=None)
@example(rows=[{}, {"loss": 2**60}], key="loss")  # --key the loss: a row without it is no norm row (msgspec)
@example(rows=[{"step": 2**60, "grad_norm": 1.0, "t": "n/a"}, {"step": 1, "grad_norm": "n/a"}], key=None)  # words
# where a step beyond 2^53 hands the rows to from_records: a word read as None
@example(rows=[{"step": 0, "grad_norm": 1.0, "grad_2.0_norm/w": 5.0}, {"step": 1, "grad_norm": 1.0},
               {"step": 0, "grad_norm": 2.0}, {"step": 1, "grad_norm": 2.0, "grad_2.0_norm/w": 6.0}],
         key=None)  # two trainings: per-parameter norms from the last's rows only (step 0 has none: left out)
def test_a_jsonl_logs_history_from_the_columns_is_the_dict_paths(rows, key):
    from gradtool.io import logs as logs_mod

    text = "\n".join(json.dumps(r) for r in rows)

    def read(**off):
        with pytest.MonkeyPatch.context() as m:
            for name in off:
                m.setattr(logs_mod, name, lambda *a, **k: None)
            try:
                return _history(logs_mod.read_jsonl("x.jsonl", key, text))
            except (InputError, UsageError) as exc:
                return type(exc), str(exc)

    assert read() == read(json_columns=None, _msgspec_typed=None)  # the dict path's


def test_a_plain_jsonl_log_is_read_by_the_columns(monkeypatch):
    from gradtool.io import logs as logs_mod

    monkeypatch.setattr(logs_mod, "_msgspec_typed", lambda *a, **k: pytest.fail("the msgspec path was used"))
    monkeypatch.setattr(logs_mod, "from_records", lambda *a, **k: pytest.fail("the dict path was used"))
    text = "".join(json.dumps({"step": i, "grad_norm": [1.5, math.nan][i % 2], "loss": 2, "epoch": 0.1 * i})
                   + "\n" for i in range(50))
    h = logs_mod.read_jsonl("x.jsonl", text=text)
    assert h.steps == list(range(50)) and [repr(v) for v in h.norms[:2]] == ["1.5", "nan"]
    assert h.loss == [2.0] * 50


def test_a_jsonl_log_with_times_and_names_is_read_by_the_columns(monkeypatch):
    """A line with a string no float() reads (a logger's time, a run's name; a header line of them) was
    left with the whole log to msgspec's typed rows or to the dict path (10^6 lines after a header line:
    3.6 -> 0.94 s): such a word is no number, flag 3, and the norm a word in some row is no norm there,
    as to the dict path."""
    from gradtool.io import logs as logs_mod

    monkeypatch.setattr(logs_mod, "_msgspec_typed", lambda *a, **k: pytest.fail("the msgspec path was used"))
    monkeypatch.setattr(logs_mod, "from_records", lambda *a, **k: pytest.fail("the dict path was used"))
    text = '{"run": "gpt2-small", "host": "node-7"}\n' + "".join(
        json.dumps({"time": f"2024-01-01T10:00:{i:02d}", "step": i, "grad_norm": "n/a" if i == 3 else 1.5,
                    "loss": 2}) + "\n" for i in range(50))
    rows, names, values, flags, first = log_readers().json_rows(text)
    assert (rows, first) == (51, 2) and names == [b"run", b"host", b"time", b"step", b"grad_norm", b"loss"]
    assert np.frombuffer(flags[0], np.uint8).tolist() == [3] + [0] * 50
    assert np.frombuffer(flags[4], np.uint8).tolist() == [0, 1, 1, 1, 3] + [1] * 46
    h = logs_mod.read_jsonl("x.jsonl", text=text)
    assert h.steps == [i for i in range(50) if i != 3] and h.norms == [1.5] * 49 and h.loss == [2.0] * 49


def _array_reference(text: str, start: int):
    """What json_array_rows must give of the array at ``start``: json.loads of it, as _reference reads a
    line's object, and the offset after it; None when json.loads refuses it or an element is no flat
    object of numbers."""
    try:
        doc, end = json.JSONDecoder().raw_decode(text, start + len(text[start:]) - len(text[start:].lstrip(" \t\r\n")))
    except ValueError:
        return None
    if type(doc) is not list or any(type(d) is not dict for d in doc):
        return None
    ref = _reference("\n".join(json.dumps(d) for d in doc).encode()) if doc else (0, [], {}, 0)
    return None if ref is None else (*ref, end)


def _compiled_array(text: str, start: int):
    got = log_readers().json_array_rows(text, start)
    if got is None:
        return None
    *table, end = got
    return (*_compiled_table(table), end)


def _compiled_table(table):
    rows, names, values, flags, first = table
    keys = [n.decode("ascii") for n in names]
    columns = {k: list(zip(map(repr, np.frombuffer(v, np.float64).tolist()), np.frombuffer(f, np.uint8).tolist()))
               for k, v, f in zip(keys, values, flags)}
    return rows, keys, columns, first


@st.composite
def _arrays(draw):
    """A JSON array of objects as json.dump(..., indent=...) writes a trainer_state.json's log_history,
    or spaced any way, now and then an element or a token of another kind."""
    blank = st.sampled_from(["", " ", "\n", "\n    ", "\r\n  ", "\t"])
    elements = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.integers(0, 15))
        if kind == 0:
            elements.append(draw(st.sampled_from(["1", "[]", '"x"', "null", "{", "{}", '{"a": {}}'])))
            continue
        keys = draw(st.lists(_KEYS, max_size=5))
        values = [draw(_OTHERS if kind == 1 else _NUMBERS) for _ in keys]
        items = ",".join(f'{draw(blank)}"{k}"{draw(blank)}:{draw(blank)}{v}{draw(blank)}' for k, v in zip(keys, values))
        elements.append("{" + items + draw(blank) + "}")
    body = ",".join(draw(blank) + e + draw(blank) for e in elements)
    tail = draw(st.sampled_from(["]", "]", "] ,", ",]", "", "]]"]))
    return draw(st.sampled_from(["", '{"log_history": ', "  "])) + "[" + body + tail + draw(st.sampled_from(["", "}", " x"]))


@settings(max_examples=400, deadline=None)
@given(_arrays())
@example('[\n  {\n    "epoch": 0.01,\n    "grad_norm": NaN,\n    "step": 1\n  },\n  {}\n]')
@example("[]")
@example("[{},]")  # a trailing comma: no JSON
@example('[{"a": 1} {"a": 2}]')  # no comma between
def test_where_the_compiled_array_reader_answers_its_columns_are_what_json_loads_reads(text):
    start = text.index("[")
    got = _compiled_array(text, start)
    if got is not None:
        assert got == _array_reference(text, start)


def test_a_trainer_states_log_history_is_read_by_the_compiled_array_reader(tmp_path, monkeypatch):
    """trainer_state.json as the Trainer writes it (indent 2, sorted keys, an evaluation entry among the
    steps, a NaN norm) is read by json_array_rows, not decoded whole: the history json.loads gives."""
    from gradtool.io import logs

    history = [{"epoch": i / 100, "grad_norm": math.nan if i == 7 else 1.0 + i % 5, "learning_rate": 5e-05,
                "loss": 2.5 - i / 1000, "step": i} for i in range(1, 300)]
    history.insert(50, {"epoch": 0.5, "eval_loss": 2.0, "eval_runtime": 1.5, "step": 50})
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps({"best_metric": None, "epoch": 3.0, "global_step": 299, "log_history": history,
                             "logging_steps": 1, "trial_params": None}, indent=2, sort_keys=True))
    decoded = []
    real = logs._decode_json
    monkeypatch.setattr(logs, "_decode_json", lambda t: decoded.append(len(t)) or real(t))
    h = logs.read_norm_log(str(p))
    want = logs.from_records(history, str(p), "trainer_state")
    assert (h.kind, h.steps, repr(h.norms), h.loss, h.lr, h.notes) == (
        "trainer_state", want.steps, repr(want.norms), want.loss, want.lr, want.notes)
    assert decoded and max(decoded) < 500  # the document without its log_history


@pytest.mark.parametrize("doc", [
    # the array found first is not the one json.loads keeps, or not the document's: the whole is decoded
    '{"log_history": [{"step": 1, "grad_norm": 1.0}], "log_history": [{"step": 2, "grad_norm": 2.0}]}',
    '{"x": {"log_history": [{"step": 1, "grad_norm": 1.0}]}, "log_history": [{"step": 2, "grad_norm": 2.0}]}',
    '{"x": {"log_history": [{"step": 1, "grad_norm": 1.0}]}, "log\\u005fhistory": [{"step": 3, "grad_norm": 3.0}]}',
    '{"note": "gradtool: log_history read by columns", "log_history": [{"step": 1, "grad_norm": 1.0}]}',
    '{"x": {"log_history": [{"step": 1, "grad_norm": 1.0}]}, "log_history": "gradtool: log_history read by columns"}',
    '{"log_history": [{"step": 1, "grad_norm": 1.0}, {"step": 2, "grad_norm": "2"}]}',
    '{"log_history": [{"step": 1, "grad_norm": 1.0}]} trailing',
    '{"log_history": []}', '{"log_history": [{"step": 1, "grad_norm": 1.0}], }',
])
def test_a_trainer_state_is_read_as_json_loads_reads_it(tmp_path, doc):
    from gradtool.io import logs

    p = tmp_path / "trainer_state.json"
    p.write_text(doc)

    def read():
        try:
            h = logs.read_norm_log(str(p))
        except Exception as exc:
            return type(exc), str(exc)
        return h.kind, h.steps, h.norms

    got = read()
    with pytest.MonkeyPatch.context() as m:
        m.setenv("GRADTOOL_NO_KERNELS", "1")
        want = read()
    assert got == want
