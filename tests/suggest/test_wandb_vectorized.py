"""The NumPy W&B history reader (gradtool/io/wandb_vectorized.py), what installs without the compiled one
read W&B logs with: its value texts against Python's _number, its logs read in chunks of every size
against the Python reader (tests/wandb_logs.py: the same rows, notes and errors), and that it reads the
layout wandb writes itself, not through the Python reader."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.errors import InputError
from gradtool.io import wandb_log, wandb_vectorized
from gradtool.io.wandb_vectorized import FLOAT, INTEGER, NOT_A_NUMBER, UNSURE, byte_columns, number_values
from tests.wandb_encoder import pb_bytes, pb_int, write_log
from tests.wandb_logs import history_record, number_texts as texts_of_numbers, read_every_way, read_with
from tests.wandb_logs import records, trainer_logs


def _kinds_and_values(texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    buf = np.frombuffer(b"".join(texts) + bytes(512), dtype=np.uint8)
    columns = byte_columns(buf, np.cumsum(lengths) - lengths, lengths, max(1, int(lengths.max(initial=1))))
    return number_values(columns, lengths)


ODD_TEXTS = [b"1.", b".5", b"-.5", b"1e5", b"1E+05", b"-0", b"007", b"1.e5", b"--1", b"1e", b"e5", b"-", b".",
             b"1.2.3", b"1e5e5", b"1+5", b"+1", b"1\x00", b"nan", b"Infinity", b"-Infinity", b"NaN", b"1e5.5",
             b"-1e.5", b"1-", b"1e+", b"0,5", b"1/2"]


@settings(max_examples=300)
@given(st.lists(st.one_of(texts_of_numbers, st.sampled_from(ODD_TEXTS)), max_size=40))
@example([b"9007199254740993", b"123456789012345", b"1234567890123456", b"0" * 30])
@example([b"2.2250738585072011e-308", b"4.9e-324", b"1e400", b"1.1145809631507386", b"9007199254740993.0"])
def test_value_texts_read_as_python_reads_them(texts):
    """Each text NOT_A_NUMBER where _number gives None, INTEGER where it gives an int (exact: at most 15
    digits), FLOAT with float()'s double where it gives a float; UNSURE (left to Python) only for texts
    outside the JSON-number forms."""
    kinds, values = _kinds_and_values(texts)
    for text, kind, value in zip(texts, kinds.tolist(), values.tolist()):
        want = wandb_log._number(text)
        if kind == UNSURE:
            assert not (text[:1].isdigit() and text.replace(b".", b"", 1).isdigit() and len(text) <= 15), text
            continue
        if kind == NOT_A_NUMBER:
            assert want is None, text
            continue
        assert type(want) is (int if kind == INTEGER else float), text
        assert (math.isnan(value) and math.isnan(want)) or (
            value == want and math.copysign(1, value) == math.copysign(1, want)), text


def test_value_texts_of_the_forms_wandb_writes_are_not_left_to_python():
    texts = [b"0.5", b"1.1145809631507386", b"-3", b"12", b"5e-05", b"4.9e-05", b"1E+22", b"0", b"-0.0"]
    kinds, values = _kinds_and_values(texts)
    assert kinds.tolist() == [FLOAT, FLOAT, FLOAT, INTEGER, FLOAT, FLOAT, FLOAT, INTEGER, FLOAT]
    assert values.tolist() == [float(t) for t in texts]


@contextlib.contextmanager
def _chunks_of(blocks: int):
    saved = wandb_vectorized.CHUNK_BLOCKS
    wandb_vectorized.CHUNK_BLOCKS = blocks
    try:
        yield
    finally:
        wandb_vectorized.CHUNK_BLOCKS = saved


@settings(max_examples=60, deadline=None)
@given(st.lists(records(), max_size=30), st.sampled_from([1, 2, 3]),
       st.sampled_from([None, "grad_norm", "_step", "_runtime"]))
def test_logs_read_in_small_chunks_read_the_same(tmp_path_factory, recs, blocks, key):
    """Chunks of one to three blocks: records split over blocks joined across chunks, a whole record
    between the parts of a split one, a chunk of no whole record; the same rows as the Python reader's."""
    with _chunks_of(blocks):
        read_every_way(tmp_path_factory, recs, key)


@settings(max_examples=60, deadline=None)
@given(trainer_logs(), st.integers(0, 10**7), st.integers(1, 255), st.sampled_from([1, 2]))
def test_damaged_logs_read_in_small_chunks_read_the_same(tmp_path_factory, recs, at, byte, blocks):
    with _chunks_of(blocks):
        read_every_way(tmp_path_factory, recs + [b"x" * 40000] + recs, damage=(at, byte))


def test_the_numpy_reader_reads_a_trainer_log_itself(tmp_path, monkeypatch):
    """The rows of wandb's layout (whole records and those split over blocks) are read with no call of the
    Python reader; values that are not numbers give no item; wandb's _runtime floats of digits and a
    point are classified but not parsed (NaN, as the compiled reader leaves them), unless --key names it."""
    recs = [history_record(i, [(b"train/grad_norm", repr(0.5 + i).encode()), (b"_runtime", b"1.5"),
                               (b"img", b'{"_type": "image"}'), (b"train/global_step", str(i + 1).encode())],
                           i) for i in range(3000)]
    p = str(write_log(tmp_path / "run-x.wandb", recs))
    monkeypatch.setattr(wandb_log, "history_rows", None)  # never called
    monkeypatch.setattr(wandb_log, "_number", None)
    items = wandb_log._row_items(p, p, None)
    assert items.n_rows == 3000
    assert items.keys == ["train/grad_norm", "_runtime", "train/global_step", "_step"]
    given, values, ints = items.column("train/grad_norm")
    assert given.all() and values.tolist() == [0.5 + i for i in range(3000)] and not ints.any()
    given, steps, ints = items.column("train/global_step")
    assert steps.tolist() == list(range(1, 3001)) and ints.all()
    assert items.column("_step")[1].tolist() == list(range(3000))
    given, runtime, _ = items.column("_runtime")
    assert given.all() and np.isnan(runtime).all()
    given, runtime, _ = wandb_log._row_items(p, p, None, key="_runtime").column("_runtime")
    assert given.all() and (runtime == 1.5).all()


def test_a_few_wide_records_are_left_to_python_past_their_first_items(tmp_path, monkeypatch):
    """Records of hundreds of items, fewer than FEW_RECORDS of them (a log of each parameter's norm, a few
    steps long), that the search by bytes does not read (here: it is turned off), are read by the Python
    reader past their first 64 items of the walk (a NumPy step of a few arrays a item cost more), to the
    same rows; as many records as FEW_RECORDS are walked side by side."""
    monkeypatch.setattr(wandb_vectorized, "LONG_HISTORY", 1 << 62)
    names = [f"grad_2.0_norm/p{k}".encode() for k in range(300)]
    history_rows = wandb_log.history_rows
    for n, python in ((3, True), (wandb_vectorized.FEW_RECORDS, False)):
        recs = [history_record(i, [(b"grad_2.0_norm_total", repr(1.5 + i).encode()),
                                   *((k, repr(0.01 * j + i).encode()) for j, k in enumerate(names))], i)
                for i in range(n)]
        p = str(write_log(tmp_path / f"run-{n}.wandb", recs))
        calls = []
        monkeypatch.setattr(wandb_log, "history_rows", lambda r, calls=calls: calls.append(1) or history_rows(r))
        assert read_with(p, None, "numpy") == read_with(p, None, "python")
        items = wandb_log._row_items(p, p, None)
        assert (len(calls) > n) == python and items.n_rows == n and len(items.keys) == 302
        assert items.column("grad_2.0_norm/p299")[1].tolist() == [2.99 + i for i in range(n)]


@st.composite
def _long_records(draw):
    """Records of hundreds of items (each parameter's norm), a few of them broken: a key holding the bytes
    an item starts with (a candidate inside an item), a step between the items, wandb's ``_info`` field,
    an item of another layout, a step past 2^53, a history cut short."""
    n = draw(st.integers(1, 4))
    out = []
    for i in range(n):
        items = []
        for k in range(draw(st.integers(120, 300))):
            key = f"grad_2.0_norm/p{k}".encode()
            if draw(st.integers(0, 40)) == 0:
                key = draw(st.sampled_from([b"\x0a\x10\x0a\x05abcde\x82\x01\x05", b"k\x12\x03\x08\x01",
                                            b"\x0a", b"\x82\x01", b"x" * 100]))
            value = draw(texts_of_numbers) if draw(st.integers(0, 10)) == 0 else repr(0.01 * k + i).encode()
            items.append(pb_bytes(1, pb_bytes(1, key) + pb_bytes(16, value)))
        odd = draw(st.sampled_from(["none"] * 4 + ["step_inside", "info", "nested", "huge_step", "cut"]))
        at = draw(st.integers(0, len(items)))
        if odd == "step_inside":
            items.insert(at, pb_bytes(2, pb_int(1, i)))
        elif odd == "info":
            items.insert(at, pb_bytes(200, pb_bytes(1, b"stream")))
        elif odd == "nested":
            items.insert(at, pb_bytes(1, pb_bytes(2, b"grads") + pb_bytes(2, b"w") + pb_bytes(16, b"1.5")))
        body = b"".join(items)
        if draw(st.booleans()):
            body += pb_bytes(2, pb_int(1, 2**60 if odd == "huge_step" else i))
        if odd == "cut":
            body = body[:draw(st.integers(0, len(body)))]
        out.append(pb_int(1, i) + pb_bytes(2, body))
    return out


@settings(max_examples=60, deadline=None)
@given(_long_records(), st.sampled_from([None, "grad_2.0_norm/p7"]))
def test_long_records_read_by_their_bytes_read_the_same(tmp_path_factory, recs, key):
    """Records of hundreds of items, their items found by their bytes (chained_items) where they chain and
    walked where not (a candidate inside an item, a field of another kind, a cut): the Python reader's
    rows."""
    read_every_way(tmp_path_factory, recs, key)


def test_long_records_are_read_by_their_bytes_without_python(tmp_path, monkeypatch):
    """A log of each of 5,000 parameters' norm (a mixture of experts; records of ~180 KB, split over
    blocks), even three records of it, and records of 150 keys after them: every item found by its bytes
    (chained_items), not by a walk of 5,000 steps nor by Python."""
    names = [f"grad_2.0_norm/layers.{k // 4}.{'qkvo'[k % 4]}_proj.weight".encode() for k in range(5000)]
    recs = [history_record(i, [(b"grad_2.0_norm_total", repr(1.5 + i).encode()),
                               *((k, repr(0.01 * j + i).encode()) for j, k in enumerate(names))], i)
            for i in range(3)]
    # and records of 150 keys (~8 KB) after them, whole in their blocks: in the chunk before the records
    # joined from their parts (the histories are not in the records' order in the chunk's buffer)
    recs += [history_record(3 + i, [(k, b"0.5") for k in names[:150]], 3 + i) for i in range(6)]
    p = str(write_log(tmp_path / "run-x.wandb", recs))
    want = read_with(p, None, "python")
    chained = wandb_vectorized.chained_items
    read_by_bytes = []
    monkeypatch.setattr(wandb_vectorized, "chained_items",
                        lambda *a: read_by_bytes.append(len((got := chained(*a))[0])) or got)
    monkeypatch.setattr(wandb_log, "history_rows", None)  # never called
    assert read_with(p, None, "numpy") == want and sum(read_by_bytes) == 9
    items = wandb_log._row_items(p, p, None)
    assert items.n_rows == 9 and len(items.keys) == 5002
    assert items.column(names[-1].decode())[1][:3].tolist() == [0.01 * 4999 + i for i in range(3)]
    assert items.column(names[0].decode())[1][3:].tolist() == [0.5] * 6


@pytest.mark.parametrize("cut", [1, 3, 6])
@pytest.mark.parametrize("last", ["item", "step"])
def test_a_history_cut_inside_its_last_field_reads_as_python_reads_it(tmp_path_factory, cut, last):
    """A HistoryRecord whose last field, an item or the step, runs past its end (its length says more
    bytes than the history holds): neither reader takes the field (Python: "truncated field"), walked or
    found by its bytes."""
    items = [pb_bytes(1, pb_bytes(1, b"grad_norm") + pb_bytes(16, b"1.25")) for _ in range(3)]
    tail = (pb_bytes(1, pb_bytes(1, b"loss") + pb_bytes(16, b"2.5")) if last == "item"
            else pb_bytes(2, pb_int(1, 300)))
    whole = [pb_int(1, i) + pb_bytes(2, b"".join(items) + pb_bytes(2, pb_int(1, i))) for i in range(5)]
    broken = pb_int(1, 5) + pb_bytes(2, b"".join(items) + tail[:len(tail) - cut])
    assert read_every_way(tmp_path_factory, whole + [broken] + whole)[0] is InputError


def test_other_fields_of_a_history_are_skipped_without_python(tmp_path, monkeypatch):
    """A HistoryRecord's fields besides its items and step (wandb's ``_info``, field 200), and a Record's
    after its history (``control``, 16), are skipped by the NumPy reader itself, as Python skips them."""
    body = (pb_bytes(1, pb_bytes(1, b"grad_norm") + pb_bytes(16, b"0.5")) + pb_bytes(200, pb_bytes(1, b"s"))
            + pb_bytes(2, pb_int(1, 7)))
    recs = [pb_int(1, i) + pb_bytes(2, body) + pb_bytes(16, pb_int(1, 1)) for i in range(100)]
    p = str(write_log(tmp_path / "run-x.wandb", recs))
    want = read_with(p, None, "python")
    monkeypatch.setattr(wandb_log, "history_rows", None)  # never called
    items = wandb_log._row_items(p, p, None)
    assert items.n_rows == 100 and items.records() == [{"grad_norm": 0.5, "_step": 7}] * 100
    monkeypatch.undo()
    assert read_with(p, None, "numpy") == want


def test_records_of_other_layouts_are_read_by_python_in_their_place(tmp_path):
    """A record the NumPy reader does not read (an item of a two-byte length, a nested key) is read by
    history_rows, its row kept in its place among the others."""
    long_key = b"grad_2.0_norm/" + b"k" * 200
    nested = pb_bytes(1, pb_bytes(2, b"a") + pb_bytes(2, b"b") + pb_bytes(16, b"7"))
    recs = [history_record(0, [(b"grad_norm", b"1.0")], 0), history_record(1, [(long_key, b"2.5")], 1),
            history_record(2, [(b"grad_norm", b"3.0")], 2), pb_int(1, 5) + pb_bytes(2, nested),
            history_record(4, [(b"grad_norm", b"NaN")], 4)]
    p = str(write_log(tmp_path / "run-x.wandb", recs))
    items = wandb_log._row_items(p, p, None)
    assert items.keys == ["grad_norm", "_step", long_key.decode(), "a.b"]
    assert repr(items.records()) == repr([
        {"grad_norm": 1.0, "_step": 0}, {long_key.decode(): 2.5, "_step": 1}, {"grad_norm": 3.0, "_step": 2},
        {"a.b": 7}, {"grad_norm": math.nan, "_step": 4}])
    assert read_with(p, None, "numpy") == read_with(p, None, "python")


def test_items_of_other_layouts_are_read_by_python(tmp_path):
    """Items as history_rows' fast path does not read them (a field after the value, the value before the
    key, a value's length byte that does not match the item's): their records read by Python, in place."""
    item = pb_bytes(1, b"grad_norm") + pb_bytes(16, b"2.5")
    layouts = [item + pb_int(3, 7), pb_bytes(16, b"2.5") + pb_bytes(1, b"grad_norm"),
               item[:-4] + b"\x02" + item[-3:], item + b"\x1a\x00"]
    for n, body in enumerate(layouts):
        recs = [history_record(0, [(b"grad_norm", b"1.0")], 0), pb_int(1, 1) + pb_bytes(2, pb_bytes(1, body)),
                history_record(2, [(b"grad_norm", b"3.0")], 2)]
        p = write_log(tmp_path / f"run-{n}.wandb", recs)
        assert read_with(p, None, "numpy") == read_with(p, None, "python")


def test_a_collision_of_key_hashes_reads_the_log_in_python(tmp_path, monkeypatch):
    """Keys are told apart by a hash and checked against their bytes: two keys of one hash (here every
    key's) are seen, and the log is read by the Python reader, with the same history."""
    recs = [history_record(i, [(b"train/grad_norm", repr(0.5 + i).encode()), (b"train/loss", b"2.0")], i)
            for i in range(50)]
    p = str(write_log(tmp_path / "run-x.wandb", recs))
    want = read_with(p, None, "python")
    monkeypatch.setattr(wandb_vectorized, "key_hashes", lambda names, _: np.zeros(len(names), np.uint64))
    assert wandb_log._row_items(p, p, None) is None
    assert read_with(p, None, "numpy") == want
