"""The compiled W&B history reader (gradtool/io/_logscan.c), the NumPy one (wandb_vectorized) and the
columns history of their rows (logs.from_row_items) against the Python reader (history_rows,
from_records): the same history, notes and errors on generated logs (layouts wandb writes and others,
values of every kind, steps going back, records split over blocks) and on damaged ones; the compiled
CRC-32 against zlib's and its numbers against Python's float() and int()."""

from __future__ import annotations

import math
import os
import zlib

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.errors import InputError
from gradtool.io import logs, wandb_log
from tests.wandb_encoder import write_log
from tests.wandb_logs import (SmallKeyTable, history_record, number_texts, read_every_way, read_with,
                              records, trainer_logs)

scan = wandb_log._compiled_reader()
needs_reader = pytest.mark.skipif(scan is None,
                                  reason="gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")


def test_ci_builds_the_compiled_reader():
    if os.environ.get("CI") and not os.environ.get("GRADTOOL_NO_KERNELS"):
        assert scan is not None, "gradtool.io._logscan did not build: is a C compiler installed?"


@needs_reader
@given(st.one_of(st.binary(max_size=300), st.binary(min_size=60, max_size=5000)), st.integers(0, 2**32 - 1),
       st.integers(0, 15))
def test_crc32_is_zlibs(data, seed, offset):
    """By carry-less multiplication (where the CPU has it: 16-byte blocks of records of 64 bytes or more,
    four lanes of 16 bytes; from 256 bytes eight lanes in 256-bit vectors, where it has VPCLMULQDQ, or
    sixteen in 512-bit ones, where it has AVX-512 too), by each of those at most and by the tables alone,
    from any alignment."""
    from gradtool.io._logscan import crc32

    view = memoryview(bytes(offset) + data)[offset:]
    want = zlib.crc32(data, seed)
    assert crc32(view, seed) == want == crc32(view, seed, False)
    assert [crc32(view, seed, simd) for simd in (1, 2, 3)] == [want] * 3


@needs_reader
def test_crc32_of_a_large_buffer_is_zlibs():
    from gradtool.io._logscan import crc32, crc32_simd

    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    for n in (64, 65, 79, 80, 127, 128, 129, 255, 256, 257, 271, 272, 319, 320, 383, 384, 400, 511, 512,
              575, 576, 767, 768, 1000, 1 << 20, (1 << 20) + 208, 3 << 20):  # each path's steps and ends
        want = zlib.crc32(data[:n])
        assert [crc32(data[:n], 0, simd) for simd in (0, 1, 2, 3)] == [want] * 4 == [crc32(data[:n])] * 4
    assert crc32_simd() in (0, 1, 2, 3)
    if os.environ.get("CI") and os.uname().machine == "x86_64":
        assert crc32_simd()  # (every x86-64 CPU since 2010 has PCLMULQDQ)


def _same_number(kind: int, x: float, text: bytes) -> None:
    want = wandb_log._number(text)
    if kind == -1:  # left to Python
        return
    if kind == 0:
        assert want is None, text
        return
    assert type(want) is (int if kind == 2 else float), text
    same = x == want and math.copysign(1, x) == math.copysign(1, want)
    assert (math.isnan(x) and math.isnan(want)) or same, text


@needs_reader
@given(number_texts)
@example(b"NaN")
@example(b"-Infinity")
@example(b"1_0")
@example(b"1.")
@example(b"007")
@example(b"-0")
@example(b"9007199254740993")
@example(b"123456789012345")
@example(b"1e400")
@example(b"2.2250738585072011e-308")
@example(b"0.000000000000000000000000000001")
@example(b"1234567890123456789012345e-10")
@example(b"9007199254740993.0")  # halfway between two doubles: ties to even
@example(b"9007199254740993e0")  # the same, an exact product in the Eisel-Lemire step: undecided there
@example(b"9007199254740995e0")
@example(b"2.2250738585072014e-308")  # the smallest normal double
@example(b"4.9e-324")  # subnormal
@example(b"1.7976931348623157e308")
@example(b"1.7976931348623159e308")  # beyond the largest double: inf
@example(b"1.1145809631507386")  # 17 digits, as a float32 grad norm's .item() prints
@example(b"9999999999999999999e-128")  # 19 digits at the ends of the table of powers of ten
@example(b"1000000000000000000e64")
def test_numbers_are_pythons(text):
    from gradtool.io._logscan import number

    _same_number(*number(text), text)


# --- logs of every kind, read every way (tests/wandb_logs.py) ------------------------------------

@settings(max_examples=150, deadline=None)
@given(trainer_logs(), st.sampled_from([None, "train/grad_norm", "train/loss", "grad_2.0_norm/w", "missing"]))
def test_trainer_logs_read_the_same(tmp_path_factory, recs, key):
    read_every_way(tmp_path_factory, recs, key)


@settings(max_examples=150, deadline=None)
@given(st.lists(records(), max_size=30), st.sampled_from([None, "grad_norm", "_step", "\ufffd", "_runtime"]))
def test_records_of_every_layout_read_the_same(tmp_path_factory, recs, key):
    read_every_way(tmp_path_factory, recs, key)


@settings(max_examples=100, deadline=None)
@given(trainer_logs(), st.integers(0, 10**7), st.integers(1, 255))
def test_damaged_logs_read_the_same(tmp_path_factory, recs, at, byte):
    """A byte changed anywhere (a CRC, a length, a type, the data): the same rows, or the same error."""
    read_every_way(tmp_path_factory, recs, damage=(at, byte))


@needs_reader
def test_the_compiled_reader_reads_a_trainer_log_itself(tmp_path, monkeypatch):
    """The rows of wandb's layout are read by the compiled reader, those in whole blocks by wandb_block
    and those split over two blocks (joined by the Python reader) by wandb_record, none by the Python
    reader; wandb's _runtime is classified but not parsed, unless --key names it."""
    recs = [history_record(i, [(b"train/grad_norm", repr(0.5 + i).encode()), (b"_runtime", b"1.5"),
                         (b"img", b'{"_type": "image"}')], i) for i in range(2000)]
    p = str(write_log(tmp_path / "run-x.wandb", recs))
    calls = {"block": 0, "record": 0}

    class Counting:
        def wandb_block(self, *args):
            stop, rows = scan.wandb_block(*args)
            calls["block"] += rows
            return stop, rows

        def wandb_record(self, *args):
            got = scan.wandb_record(*args)
            calls["record"] += got
            return got

    monkeypatch.setattr(wandb_log, "history_rows", None)  # never called
    items = wandb_log._row_items(p, p, Counting())
    assert items.n_rows == 2000 and calls["block"] > 1900 and calls["block"] + calls["record"] == 2000
    assert items.keys == ["train/grad_norm", "_runtime", "_step"]  # (img: not a number, no key)
    given, values, ints = items.column("train/grad_norm")
    assert given.all() and values.tolist() == [0.5 + i for i in range(2000)] and not ints.any()
    given, steps, ints = items.column("_step")
    assert steps.tolist() == list(range(2000)) and ints.all()
    given, runtime, _ = items.column("_runtime")
    assert given.all() and np.isnan(runtime).all()
    given, runtime, _ = wandb_log._row_items(p, p, scan, key="_runtime").column("_runtime")
    assert given.all() and (runtime == 1.5).all()


@pytest.mark.parametrize("keys", [300, 1200, 5000, 65_535])
def test_a_log_of_each_parameters_norm_is_read_by_the_compiled_reader(tmp_path, monkeypatch, keys):
    """A record of hundreds or thousands of keys (W&B's history of each parameter's gradient norm, a
    mixture of experts' too): the compiled reader's key table grows (rehashing, the record's new keys
    kept), the rows are the Python reader's, and none is left to it; past MAX_KEYS (65,536) distinct keys
    in a record Python reads it."""
    names = [f"grad_2.0_norm/layers.{k}.weight".encode() for k in range(keys)]
    recs = [history_record(i, [(b"grad_2.0_norm_total", b"1.5"), *((n, repr(0.01 * k + i).encode())
                                                                   for k, n in enumerate(names))], i)
            for i in range(6)]
    p = write_log(tmp_path / "run-x.wandb", recs)
    want = read_with(p, None, "python")
    assert read_with(p, None, "compiled") == want and read_with(p, None, "numpy") == want
    if scan is None:
        return
    calls = []
    history_rows = wandb_log.history_rows
    monkeypatch.setattr(wandb_log, "history_rows", lambda r: calls.append(1) or history_rows(r))
    items = wandb_log._row_items(str(p), str(p), scan)
    assert items.n_rows == 6 and len(items.keys) == keys + 2
    assert bool(calls) == (keys + 2 > 65_536)
    assert items.column(names[-1].decode())[1].tolist() == [0.01 * (keys - 1) + i for i in range(6)]


@needs_reader
@pytest.mark.parametrize("max_keys", [7, 9, 65_536])
def test_a_key_table_kept_over_a_log_whose_keys_change_reads_every_record(tmp_path, monkeypatch, max_keys):
    """The key table is kept from record to record (a key looked up once a log): a log whose keys change
    over time fills it, and a record that finds it full is read again from an empty table, by the compiled
    reader still, not left to Python (max_keys 7: each record's seven keys, _step among them, just fit),
    while a record of more keys than the table holds is left to it; the rows are the Python reader's."""
    recs = [history_record(i, [(f"grad_2.0_norm/p{i + k}".encode(), repr(0.5 + i + k).encode())
                               for k in range(5)] + [(b"grad_norm", repr(1.0 + i).encode())], i)
            for i in range(300)]
    recs.append(history_record(300, [(f"grad_2.0_norm/q{k}".encode(), b"1.5") for k in range(8)], 300))
    p = write_log(tmp_path / "run-x.wandb", recs)
    want = read_with(p, None, "python")
    history_rows = wandb_log.history_rows
    calls = []
    monkeypatch.setattr(wandb_log, "history_rows", lambda r: calls.append(1) or history_rows(r))
    compiled = wandb_log._compiled_reader
    monkeypatch.setattr(wandb_log, "_compiled_reader", lambda: SmallKeyTable(compiled(), max_keys))
    assert read_with(p, None, "compiled") == want
    assert len(calls) == (max_keys < 9)  # the last record's nine keys: to Python past a table of 7
    calls.clear()
    items = wandb_log._row_items(str(p), str(p), wandb_log._compiled_reader())
    assert items.n_rows == 301 and len(items.keys) == 304 + 2 + 8 and len(calls) == (max_keys < 9)
    assert items.column("grad_2.0_norm/p7")[1][3:8].tolist() == [7.5] * 5


@needs_reader
def test_a_key_table_is_emptied_for_another_dict_of_keys_or_skip_set():
    """A key table remembers each key's index in one dict of keys and whether one skip set skips it: given
    with another dict or set it starts empty, and reads as a new table does."""
    record = history_record(0, [(b"_runtime", b"1.5"), (b"grad_norm", b"2.0")], 0)
    table = scan.key_table()

    def read(skip, table):
        out = ({}, bytearray(), bytearray(), bytearray(), skip) + ((table,) if table else ())
        assert scan.wandb_record(record, 0, out) == 1
        return out[0], np.frombuffer(out[1]).tolist()

    keys, values = read({b"_runtime"}, table)
    assert keys == {b"_runtime": 0, b"grad_norm": 1, b"_step": 2} and math.isnan(values[0])
    assert values[1:] == [2.0, 0.0]
    for skip in (set(), {b"grad_norm"}):  # another set: _runtime read, or grad_norm skipped
        got = read(skip, table)
        assert repr(got) == repr(read(skip, None)) == repr(read(skip, scan.key_table()))
    with pytest.raises(TypeError):
        scan.wandb_record(record, 0, ({}, bytearray(), bytearray(), bytearray(), set(), object()))
    with pytest.raises(ValueError):
        scan.key_table(0)


def test_row_items_give_the_records_history():
    """from_row_items on hand-made columns: a resumed run (steps going back), a step logged twice, a loss
    in a row of its own, a row without steps; and its records are the dicts the items say."""
    rows = [{"grad_norm": 1.0, "step": 1, "loss": 3.0}, {"grad_norm": 2.0, "step": 2},
            {"loss": 2.5, "step": 2}, {"grad_norm": 3.0, "step": 3}, {"grad_norm": 4.0, "step": 2},
            {"grad_norm": 5.0}, {"grad_norm": 6.0, "step": 3, "loss": 1.0, "grad_norm_x": 2}]
    keys = list(dict.fromkeys(k for r in rows for k in r))
    flat = [(i, keys.index(k), float(v), type(v) is int) for i, r in enumerate(rows) for k, v in r.items()]
    items = logs.RowItems(len(rows), keys, *(np.array(c) for c in zip(*flat)))
    assert items.records() == rows
    got, want = logs.from_row_items(items, "x", "wandb"), logs.from_records(rows, "x", "wandb")
    assert (got.steps, got.norms, got.loss, got.lr, got.notes) == (want.steps, want.norms, want.loss, want.lr,
                                                                   want.notes)
    # step 2 after 3: resumed (its later value kept); no step: the row's place among the norm rows (4)
    assert got.steps == [1, 2, 3, 4] and got.norms == [1.0, 4.0, 6.0, 5.0]
    assert got.loss == [3.0, 2.5, 1.0, None]
    assert "go back 1 time(s)" in got.notes[0]
    with pytest.raises(InputError, match="no records"):
        logs.from_row_items(logs.RowItems(0, [], *(np.zeros(0),) * 4), "x", "wandb")



def _items_of(rows):
    keys = list(dict.fromkeys(k for r in rows for k in r))
    flat = [(i, keys.index(k), float(v), type(v) is int) for i, r in enumerate(rows) for k, v in r.items()]
    return logs.RowItems(len(rows), keys, *(np.array(c) for c in zip(*flat)))


P = "grad_2.0_norm/p"


@pytest.mark.parametrize("rows", [
    # a second training in every row's norm and step: per-parameter norms from every row, as from_records
    # reads them when it takes its column path (p at step 2 only before the restart)
    [{"grad_norm": 1.0, "step": 1, P: 0.5}, {"grad_norm": 2.0, "step": 2, P: 0.7},
     {"grad_norm": 3.0, "step": 1, P: 0.9}, {"grad_norm": 4.0, "step": 2}],
    # the same with a row without a step: from_records' general path, from the last training's rows only
    [{"grad_norm": 1.0, "step": 1, P: 0.5}, {"grad_norm": 2.0, "step": 2, P: 0.7},
     {"grad_norm": 3.0, "step": 1, P: 0.9}, {"grad_norm": 4.0, "step": 2}, {"grad_norm": 5.0}],
    # steps float64 cannot count exactly, or int64 cannot hold: the records' own arithmetic
    [{"grad_norm": 1.0, "step": 2.0 ** 60}, {"grad_norm": 2.0, "step": 2.0 ** 60 + 2 ** 8}],
    [{"grad_norm": 1.0, "step": 1e300}, {"grad_norm": 2.0, "step": 1.5}, {"grad_norm": 3.0, "step": -1e300}],
    [{"grad_norm": math.nan, "step": math.inf}, {"grad_norm": 2.0, "step": math.nan},
     {"loss": 1.0, "step": 0}],
])
def test_row_items_read_as_the_records(rows):
    got, want = logs.from_row_items(_items_of(rows), "x", "wandb"), logs.from_records(rows, "x", "wandb")
    assert ((got.steps, repr(got.norms), got.loss, got.lr, got.notes, got.tensor_norms)
            == (want.steps, repr(want.norms), want.loss, want.lr, want.notes, want.tensor_norms))


def test_steps_beyond_float64s_integers_read_the_same(tmp_path_factory):
    """W&B's step counter (HistoryStep.num) or a step item beyond 2^53: exact, as the Python reader reads
    them (float64 would round 2^53 + 1)."""
    for steps in ([2**53 + 1, 2**60 + 3], [5, 2**63 - 1]):
        recs = [history_record(i, [(b"grad_norm", b"1.5")], s) for i, s in enumerate(steps)]
        h = read_every_way(tmp_path_factory, recs)
        assert h[0] == steps
        recs = [history_record(i, [(b"grad_norm", b"1.5"), (b"step", str(s).encode())])
                for i, s in enumerate(steps)]
        h = read_every_way(tmp_path_factory, recs)
        assert h[0] == steps


def test_a_split_records_part_with_a_whole_records_crc_is_damaged(tmp_path):
    """A record typed FIRST (2) whose CRC is that of a FULL (1) record of its data: the Python reader
    refuses it (its CRC is seeded with the type byte), and so does the compiled one."""
    good = history_record(1, [(b"grad_norm", b"1.5")], 1)
    p = write_log(tmp_path / "run-x.wandb", [good] * 3 + [b"x" * 40000])  # more than a block: not the last
    data = bytearray(p.read_bytes())
    at = 7 + 7 + len(good)  # the second record's header
    assert data[at + 6] == 1
    data[at + 6] = 2
    p.write_bytes(bytes(data))
    for how in ("compiled", "numpy", "python") if scan is not None else ("numpy", "python"):
        assert read_with(p, None, how) == (InputError, f"{p}: damaged W&B log (bad record at byte {at})")


@needs_reader
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 4), st.one_of(st.floats(), st.integers(-2**53, 2**53))),
                         max_size=6), max_size=25))
def test_item_columns_are_the_items_columns(rows):
    """The compiled item_columns (one column per key, as KeyColumns holds them) gives, key by key, what
    RowItems.column takes from the items: whether each row has the key, its value there (a row's later
    item of a key replacing an earlier one) and whether it is an int."""
    order = list(dict.fromkeys([*(k for items in rows for k, _ in items), *range(5)]))
    first_seen = {k: i for i, k in enumerate(order)}  # key ids in first-seen order, as the readers give them
    flat = [(r, first_seen[k], float(v), type(v) is int) for r, items in enumerate(rows) for k, v in items]
    row = np.array([f[0] for f in flat], dtype=np.int32)
    key = np.array([f[1] for f in flat], dtype=np.int32)
    value = np.array([f[2] for f in flat], dtype=np.float64)
    is_int = np.array([f[3] for f in flat], dtype=bool)
    names = [f"k{i}" for i in range(5)]
    items = logs.RowItems(len(rows), names, row, key, value, is_int)
    ids = (key << 1 | is_int).astype(np.int32)
    values, flags = scan.item_columns(value.tobytes(), row.tobytes(), ids.tobytes(), len(rows), len(names))
    columns = logs.KeyColumns(len(rows), names, [np.frombuffer(v, np.float64) for v in values],
                              [np.frombuffer(f, np.uint8) for f in flags])
    for name in [*names, "absent"]:
        (g1, v1, i1), (g2, v2, i2) = columns.column(name), items.column(name)
        assert g1.tolist() == g2.tolist() and i1.tolist() == i2.tolist()
        assert v1.tobytes() == v2.tobytes() or np.array_equal(v1, v2, equal_nan=True)
    got, want = columns.records(), items.records()  # a row's keys in the keys' order: the same keys first
    assert [repr(sorted(r.items())) for r in got] == [repr(sorted(r.items())) for r in want]  # seen
    assert list(dict.fromkeys(k for r in got for k in r)) == list(dict.fromkeys(k for r in want for k in r))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 40), st.one_of(st.floats(), st.integers(-2**53, 2**53))),
                         max_size=8), max_size=30))
def test_a_row_items_column_is_its_records_values(rows):
    """RowItems.column, by a scan of the items (few keys) or from the items sorted by key once (many: a log
    of each parameter's norm), is each row's value of the key in its records (the last item of it), NaN
    and not given where a row has none, and whether it was an int."""
    for n_keys in (41, 5):
        keyed = [[(k % n_keys, v) for k, v in items] for items in rows]
        order = list(dict.fromkeys([*(k for items in keyed for k, _ in items), *range(n_keys)]))
        first_seen = {k: i for i, k in enumerate(order)}
        flat = [(r, first_seen[k], float(v), type(v) is int)
                for r, items in enumerate(keyed) for k, v in items]
        items = logs.RowItems(len(keyed), [f"k{k}" for k in order], *(np.array(c, dtype=t) for c, t in zip(
            zip(*flat) if flat else ([], [], [], []), (np.int32, np.int32, np.float64, bool))))
        records = items.records()
        for name in [*items.keys, "absent"]:
            given, values, ints = items.column(name)
            assert given.tolist() == [name in r for r in records]
            want = [r.get(name, math.nan) for r in records]
            assert repr(values.tolist()) == repr([float(v) for v in want])
            assert ints.tolist() == [type(r.get(name)) is int for r in records]


@needs_reader
def test_item_columns_refuse_items_out_of_range():
    one = np.zeros(1).tobytes()
    with pytest.raises(ValueError):
        scan.item_columns(one, np.array([1], np.int32).tobytes(), np.array([0], np.int32).tobytes(), 1, 1)
    with pytest.raises(ValueError):
        scan.item_columns(one, np.array([0], np.int32).tobytes(), np.array([2], np.int32).tobytes(), 1, 1)
    with pytest.raises(ValueError):
        scan.item_columns(one, b"", b"", 1, 1)


@needs_reader
def test_a_trainer_log_is_read_into_one_column_per_key(tmp_path):
    """A log's rows become KeyColumns (no per-key pass over the items); a log of many keys each in few rows
    (columns larger than twice the items) and keys whose bytes decode alike keep the items."""
    recs = [history_record(i, [(b"train/grad_norm", repr(0.5 + i).encode()), (b"train/loss", b"2")], i)
            for i in range(3000)]
    p = str(write_log(tmp_path / "run-x.wandb", recs))
    columns = wandb_log._row_items(p, p, scan, columns=True)
    assert isinstance(columns, logs.KeyColumns) and columns.keys == ["train/grad_norm", "train/loss", "_step"]
    assert columns.column("train/loss")[1].tolist() == [2.0] * 3000 and columns.column("_step")[2].all()
    sparse = recs + [history_record(3000 + j, [(f"grad_2.0_norm/p{j}".encode(), b"1.0")], 3000 + j)
                     for j in range(400)]
    p = str(write_log(tmp_path / "run-y.wandb", sparse))
    assert isinstance(wandb_log._row_items(p, p, scan, columns=True), logs.RowItems)
    alike = recs[:5] + [history_record(5, [(b"train/grad_norm", b"1.0"), (b"\xff", b"1"), (b"\xfe", b"2")],
                                       5)]
    p = str(write_log(tmp_path / "run-z.wandb", alike))
    items = wandb_log._row_items(p, p, scan, columns=True)
    assert isinstance(items, logs.RowItems) and items.keys.count("\ufffd") == 1
