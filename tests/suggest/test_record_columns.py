"""from_records of many records not all alike (evaluation rows among a trainer_state.json's log_history,
values that are strings, None, bools) reads them by columns (logs.RecordColumns through
logs.from_row_items): the history, notes, per-parameter norms and errors of the loop a record at a time."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.io import logs

P = "grad_2.0_norm/layer.0"

_VALUES = st.one_of(
    st.floats(0.01, 100), st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 5000),
    st.integers(2**53 - 2, 2**53 + 2), st.none(), st.booleans(),
    st.sampled_from(["1.5", "nan", "-nan", " 2 ", "abc", "", "1e999", "-Infinity", "7"]))
_STEPS = st.one_of(st.integers(0, 40), st.floats(0, 40), st.none(), st.sampled_from(["3", "x", 2.5, math.nan]),
                   st.sampled_from([2**60, -(2**60), 1e300]))


@st.composite
def _records(draw):
    """Records as logs hold them: most with a step and a norm, evaluation rows (a loss, no norm), restarts
    and resumed steps, any value of any type now and then."""
    n = draw(st.integers(0, 200))
    keys = draw(st.sampled_from([("step", "grad_norm", "loss", "learning_rate"), ("global_step", "gnorm"),
                                 ("grad_norm", "loss"), ("step", "grad_norm", P, "epoch")]))
    rows, step = [], 0
    for _ in range(n):
        kind = draw(st.integers(0, 9))
        step = draw(st.sampled_from([step + 1, step + 1, step + 1, step, max(step - 3, 0), 0]))
        row = {k: (step if k in ("step", "global_step") else 1.0 + step % 7) for k in keys}
        if kind == 1:  # an evaluation row: no norm
            row = {"eval_loss": 2.0, "loss": draw(_VALUES), **({"step": step} if "step" in keys else {})}
        elif kind == 2:  # a value of another type
            row[draw(st.sampled_from(keys))] = draw(_STEPS if draw(st.booleans()) else _VALUES)
        elif kind == 3:  # a key left out
            row.pop(draw(st.sampled_from(keys)))
        rows.append(row)
    return rows


def _read(rows, by_rows, split=True):
    try:
        h = logs.from_records(rows, "log", "jsonl", split_trainings=split, by_rows=by_rows)
    except Exception as exc:  # (the same error both ways)
        return type(exc), str(exc)
    return (h.steps, repr(h.norms), repr(h.loss), repr(h.lr), h.notes, h.key, h.other_keys,
            repr(h.tensor_norms))


@settings(max_examples=300, deadline=None)
@given(rows=_records())
@example(rows=[{"step": i, "grad_norm": 1.0, "loss": 2.0} if i % 10 else {"step": i, "loss": 3.0, "eval_loss": 1.0}
               for i in range(100)])
@example(rows=[{"step": 2**60 + i, "grad_norm": 1.0} if i % 10 else {"step": 2**60 + i} for i in range(100)])
@example(rows=[{"step": i, "grad_norm": 10**400 if i == 70 else 1.0} if i % 10 else {"step": i} for i in range(100)])
@example(rows=[{"step": i, "grad_norm": 1.0} if i % 10 else {"step": i, "learning_rate": 10**400}
               for i in range(100)])  # (an int float() cannot take where the loop never reads it)
def test_many_records_read_by_columns_as_by_rows(rows):
    assert _read(rows, False) == _read(rows, True)
    assert _read(rows, False, split=False) == _read(rows, True, split=False)  # (merged runs: the loop's)


def test_a_trainer_states_log_history_is_read_by_columns(monkeypatch):
    """The Trainer's log_history (an evaluation row every 10 steps, no norm in it) takes the column path:
    the loop is not run."""
    rows = [{"epoch": i / 100, "grad_norm": 1.0 + i % 3, "learning_rate": 1e-4, "loss": 2.0, "step": i}
            for i in range(1, 201)]
    rows[9::10] = [{"epoch": r["epoch"], "eval_loss": 1.5, "step": r["step"]} for r in rows[9::10]]
    made = []
    real = logs.RecordColumns
    monkeypatch.setattr(logs, "RecordColumns", lambda *a: made.append(1) or real(*a))
    h = logs.from_records(rows, "trainer_state.json", "trainer_state")
    assert made and h.steps == [r["step"] for r in rows if "grad_norm" in r]
    assert h.norms == [1.0 + i % 3 for i in range(1, 201) if i % 10]
    assert _read(rows, False) == _read(rows, True)


@pytest.mark.parametrize("values, want", [
    ([1.5, 2, None, True, "3", "nan", float("-inf"), "x", 2**53 + 1],
     [1.5, 2.0, None, None, 3.0, math.nan, -math.inf, None, float(2**53 + 1)]),
    ([1, 2.5], [1.0, 2.5]), ([None, -4, 2.5], [None, -4.0, 2.5]), ([1.5, True], [1.5, None]),
])
def test_a_column_is_what_num_reads(values, want):
    given, got, is_int = logs._number_column(values)
    assert [repr(float(v)) if g else None for g, v in zip(given, got)] == [w if w is None else repr(w) for w in want]
    assert is_int.tolist() == [type(v) is int for v in values]
