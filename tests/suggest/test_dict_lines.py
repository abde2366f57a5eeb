"""Console lines that end in a dict of metrics (gradtool/io/dict_lines.py): the template reader gives the
history the general reader gives (a dict a line, then from_records), on logs of the Trainer's lines among
others, across the template reader's blocks."""

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.io import dict_lines
from gradtool.io.logs import read_norm_log


def _general(path, key=None, text=None):
    text = open(path, encoding="utf-8", newline="").read() if text is None else text
    return dict_lines._history_of_records(str(path), key, text)


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
                         "train_runtime", "grad_norm/layer.0", "lr", "'quoted'", "a b"])


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
    template = draw(st.sampled_from([_HF, _HF, ["loss", "grad_norm"], ["grad_norm", "step"]]))
    line = _dict_line(template, draw(_SEPS), draw(_PREFIXES), draw(_TAILS))
    lines = draw(st.lists(st.one_of(line, line, line, _OTHER), min_size=4, max_size=40))
    breaks = draw(st.lists(_BREAK, min_size=len(lines), max_size=len(lines)))
    return "".join(line + b for line, b in zip(lines, breaks)) + draw(st.sampled_from(["", "x", "{'loss': 1}"]))


def _hf_line(i, g, epoch):
    return f"{{'loss': {2.5 - i / 1000:.4g}, 'grad_norm': {g}, 'learning_rate': 5e-05, 'epoch': {epoch}}}"


@settings(max_examples=400, deadline=None)
@given(text=_console(), block=st.sampled_from([1, 7, 64, 1 << 22]))
@example(text="{'loss': 2.0, 'grad_norm': 1.0, 'epoch': 0.5}\n{'loss': 2.0, 'grad_norm': 2.0, 'epoch': 0.1}\n"
              "{'eval_loss': 1.0, 'epoch': 0.1}\n", block=1 << 22)
def test_the_template_reader_gives_the_general_readers_history(tmp_path_factory, text, block):
    path = tmp_path_factory.mktemp("d") / "console.log"
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    saved = dict_lines._DictTemplate.BLOCK
    dict_lines._DictTemplate.BLOCK = block
    try:
        try:
            want = _general(path)
        except Exception as exc:  # (an error the general reader raises, the template reader raises too)
            with pytest.raises(type(exc)):
                dict_lines.read_dict_lines(str(path), None, text)
            return
        _same_history(dict_lines.read_dict_lines(str(path), None, text), want)
    finally:
        dict_lines._DictTemplate.BLOCK = saved


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
    from gradtool.io.logs import _num

    texts = ["1.5", "-nan", "NaN", "inf", "1_000", "abc", "None", "-0.0", "1e999", "0x1"]
    values, flags = dict_lines._floats(texts)
    for t, v, f in zip(texts, values.tolist(), flags.tolist()):
        want = _num(t)
        assert f == (want is not None)
        if want is not None:
            assert repr(v) == repr(want) and math.copysign(1, v) == math.copysign(1, want)
        else:
            assert math.isnan(v)
