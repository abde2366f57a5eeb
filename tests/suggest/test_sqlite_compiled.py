"""The compiled reader of SQLite rows (sqlite_rows in gradtool/io/_logscan.c, through
gradtool.io.compiled.sqlite_rows): a query's rows as columns, run by the SQLite library the sqlite3 module
uses. Where it answers, its columns are what the Python readers make of the sqlite3 module's rows
(np.fromiter(..., float64) for 'f', the int for 'i', the bytes joined by line breaks for 'j'); where a value
is not one of its kind it answers None (the Python reader then reads), and only then."""

from __future__ import annotations

import math
import sqlite3
from itertools import chain

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.io.compiled import sqlite_rows
from gradtool.io.sqlite_logs import _uri

pytestmark = pytest.mark.skipif(sqlite_rows() is None, reason="gradtool.io._logscan not built, or "
                                "GRADTOOL_NO_KERNELS set, or SQLite's functions not found")

_VALUES = st.one_of(st.integers(-2**63, 2**63 - 1), st.integers(-10, 10), st.floats(allow_nan=False),
                    st.sampled_from(["nan", "NaN", "1.5", "", "{\"a\": 1}", "a\nb", "r\r", "\u00e9", "nan "]),
                    st.binary(max_size=8), st.sampled_from([b"{}", b"x\ny", b"\r", b"\xff\x00", None]))


def _python_column(values, kind):
    """The column the Python readers make of one column's values as the sqlite3 module returns them, or
    None when one is not of the kind (the compiled reader must then answer None)."""
    if kind == "f":
        out = []
        for v in values:
            if type(v) is int or type(v) is float:
                out.append(float(v))
            elif v == "nan":
                out.append(math.nan)
            else:
                return None
        assert np.array_equal(np.fromiter(out, np.float64), np.array(out, np.float64), equal_nan=True)
        return np.array(out, np.float64).tobytes()
    if kind == "i":
        return np.array(values, np.int64).tobytes() if all(type(v) is int for v in values) else None
    if not all(type(v) is bytes or (type(v) is str and v.isascii()) for v in values):
        return None
    blobs = [v.encode() if type(v) is str else v for v in values]
    if any(b"\n" in b or b"\r" in b for b in blobs):
        return None
    return b"\n".join(blobs)


@settings(deadline=None, max_examples=150)
@given(st.lists(st.tuples(_VALUES, _VALUES, _VALUES), max_size=12),
       st.sampled_from(["fij", "ffj", "jif", "f"]),
       st.sampled_from(["UTF-8", "UTF-16le", "UTF-16be"]), st.sampled_from(["r", "\u00e9", "a\x00b"]))
@example([(1, 2, b"{}"), (2.5, 3, "{}")], "fij", "UTF-8", "r")
@example([("nan", 1, "x"), (-0.0, 2, "y")], "fij", "UTF-16le", "\u00e9")
@example([(1, 2, "a\rb")], "fij", "UTF-8", "r")  # a line break of its own in a 'j' value
@example([(1, 2, b"\r")], "fij", "UTF-8", "r")
@example([(1, 2, "\u00e9")], "fij", "UTF-8", "r")  # text that is not ASCII (sqlite3 decodes it)
@example([(1, 2.0, "x")], "fij", "UTF-8", "r")  # a float where an int step must be
def test_the_compiled_rows_are_the_python_readers_rows(tmp_path_factory, rows, kinds, encoding, run):
    """Any values (ints to 64 bits, floats, texts and blobs, NULL), any database text encoding, a run
    name that is not ASCII or holds a NUL: the compiled reader's columns are the Python readers', in the
    query's order, or None exactly when a value is not of its column's kind."""
    db = tmp_path_factory.mktemp("db") / "t.db"
    con = sqlite3.connect(db)
    con.execute(f"PRAGMA encoding = '{encoding}'")
    con.execute("CREATE TABLE t (run, a, b, c)")  # no types: each value kept as given
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [(run, *r) for r in rows] + [("other", 1, 2, 3)])
    con.commit()
    sql = f"SELECT {', '.join('abc'[:len(kinds)])} FROM t WHERE run = ? ORDER BY rowid"
    python_rows = con.execute(sql, (run,)).fetchall()
    con.close()
    got = sqlite_rows()(_uri(str(db)), sql, (run,), kinds)
    want = [_python_column([r[j] for r in python_rows], k) for j, k in enumerate(kinds)]
    if None in want:
        assert got is None
    else:
        assert got is not None and got[0] == len(python_rows)
        assert [bytes(c) for c in got[1]] == want


def test_an_mlflow_query_reads_as_fromiter_reads_it(tmp_path):
    """The MLflow store's query (a NaN as the text 'nan' by CASE): the values np.fromiter reads."""
    db = tmp_path / "mlflow.db"
    con = sqlite3.connect(db)
    con.execute('CREATE TABLE metrics ("key", value, timestamp, run_uuid, step, is_nan)')
    rows = [("g", 1.5, 10, "r", 1, 0), ("g", 0.0, 11, "r", 2, 1), ("g", 7, 12, "r", 3, 0),
            ("l", 2.0, 1, "r", 1, 0)]
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?)", rows)
    con.commit()
    sql = ("SELECT step, CASE WHEN is_nan THEN 'nan' ELSE value END FROM metrics "
           "WHERE run_uuid = ? AND key = ?")
    want = np.fromiter(chain.from_iterable(con.execute(sql, ("r", "g"))), np.float64).reshape(-1, 2)
    con.close()
    n, (steps, values) = sqlite_rows()(_uri(str(db)), sql, ("r", "g"), "ff")
    assert n == 3 and np.frombuffer(steps).tolist() == want[:, 0].tolist() == [1, 2, 3]
    assert np.array_equal(np.frombuffer(values), want[:, 1], equal_nan=True) and math.isnan(want[1, 1])


@pytest.mark.parametrize("content", [b"SQLite format 3\x00" + b"\x00" * 100, b"not a database at all"])
def test_a_database_sqlite_cannot_read_gives_none(tmp_path, content):
    """SQLite's errors (not a database, damaged) are no answer: the Python reader runs the query and
    reports them."""
    db = tmp_path / "bad.db"
    db.write_bytes(content)
    assert sqlite_rows()(_uri(str(db)), "SELECT a FROM t", (), "f") is None
    assert sqlite_rows()(_uri(str(tmp_path / "missing.db")), "SELECT a FROM t", (), "f") is None


def test_the_database_is_opened_read_only(tmp_path):
    """query_only and a read-only open: a statement that writes is refused (None), the file unchanged."""
    db = tmp_path / "t.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (a)")
    con.execute("INSERT INTO t VALUES (1)")
    con.commit()
    con.close()
    before = db.read_bytes()
    assert sqlite_rows()(_uri(str(db)), "DELETE FROM t RETURNING a", (), "f") is None
    assert db.read_bytes() == before and sqlite_rows()(_uri(str(db)), "SELECT a FROM t", (), "f")[0] == 1


def test_malformed_calls_raise():
    from gradtool.io import compiled

    run = compiled.log_readers().sqlite_rows
    with pytest.raises(ValueError, match="kinds"):
        sqlite_rows()("file:x?mode=ro", "SELECT 1", (), "x")
    with pytest.raises(ValueError, match="14 function addresses"):
        run((1, 2), "file:x?mode=ro", "SELECT 1", (), "f")
    with pytest.raises(TypeError, match="params must be str"):
        sqlite_rows()("file:x?mode=ro", "SELECT ?", (1,), "f")
