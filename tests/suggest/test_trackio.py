"""Trackio projects ($HF_HOME/trackio/<project>.db) as norm histories. The Hugging Face Trainer's
report_to="trackio" logs train/grad_norm, train/loss, train/learning_rate and train/global_step there, one
row per log call, Trackio's own step counting the calls. The fixtures write the tables trackio 0.43 writes
(checked against a real project written by trackio.log; trackio is not a test dependency) and the older
layout without run_id."""

from __future__ import annotations

import json
import math
import os
import sqlite3

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.errors import InputError, UsageError
from gradtool.io.logs import read_norm_log
from tests.damaged import read_flipped

_SCHEMA_043 = """
CREATE TABLE metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, timestamp TEXT NOT NULL,
                      run_name TEXT NOT NULL, step INTEGER NOT NULL, metrics TEXT NOT NULL, log_id TEXT,
                      space_id TEXT);
CREATE INDEX idx_metrics_run_step ON metrics(run_id, step);
CREATE INDEX idx_metrics_run_timestamp ON metrics(run_id, timestamp);
CREATE UNIQUE INDEX idx_metrics_log_id ON metrics(log_id) WHERE log_id IS NOT NULL;
CREATE INDEX idx_metrics_pending ON metrics(space_id) WHERE space_id IS NOT NULL;
CREATE TABLE configs (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, run_name TEXT NOT NULL,
                      config TEXT NOT NULL, created_at TEXT NOT NULL, UNIQUE(run_id));
CREATE TABLE system_metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL,
                             timestamp TEXT NOT NULL, run_name TEXT NOT NULL, metrics TEXT NOT NULL);
"""
_SCHEMA_OLD = """
CREATE TABLE metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, timestamp TEXT NOT NULL, run_name TEXT NOT NULL,
                      step INTEGER NOT NULL, metrics TEXT NOT NULL);
CREATE INDEX idx_metrics_run_step ON metrics(run_name, step);
"""


def _as_trackio(v):  # trackio's serialize_values
    return "NaN" if isinstance(v, float) and math.isnan(v) else (
        ("Infinity" if v > 0 else "-Infinity") if isinstance(v, float) and math.isinf(v) else v)


def trackio_project(path, runs, old=False):
    """runs = [(run_id, name, start ISO, [(global_step, grad_norm)], eval_every)]: one row per Trainer log
    call as TrackioCallback.on_log writes it (metrics JSON as bytes, as trackio 0.43 stores them)."""
    con = sqlite3.connect(path)
    con.executescript(_SCHEMA_OLD if old else _SCHEMA_043)
    for rid, name, start, points, eval_every in runs:
        counter = 0
        for i, (gstep, g) in enumerate(points):
            rows = [{"train/loss": 3.0 - i / 100, "train/grad_norm": _as_trackio(g),
                     "train/learning_rate": 1e-4, "train/epoch": i / 100, "train/global_step": gstep}]
            if eval_every and (i + 1) % eval_every == 0:
                rows.append({"eval/loss": 2.5, "train/global_step": gstep})
            for row in rows:
                blob = json.dumps(row).encode()
                if old:
                    con.execute("INSERT INTO metrics (timestamp, run_name, step, metrics) "
                                "VALUES (?, ?, ?, ?)", (start, name, counter, blob.decode()))
                else:
                    con.execute("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) "
                                "VALUES (?, ?, ?, ?, ?)", (rid, start, name, counter, blob))
                counter += 1
    con.commit()
    con.close()


def _points(n, every=10, nan_at=None):
    return [(every * (i + 1), math.nan if i == nan_at else 1.0 + (i % 7) / 10) for i in range(n)]


def test_a_trackio_project_of_the_trainer(tmp_path, run):
    db = tmp_path / "my-proj.db"
    trackio_project(db, [("c0f6d109aaaa", "bright-run", "2026-11-24T13:47:38.284301+00:00",
                          _points(60, nan_at=29), 20)])
    before = (db.read_bytes(), os.stat(db).st_mtime_ns)
    h = read_norm_log(str(db))
    assert (h.kind, h.key, h.run.name) == ("trackio", "train/grad_norm", "bright-run")
    assert h.run.id == "c0f6d109aaaa"
    assert h.steps == [10 * (i + 1) for i in range(60)]  # train/global_step, not Trackio's call counter
    assert math.isnan(h.norms[29]) and h.norms[0] == 1.0 and h.loss[1] == 2.99 and h.lr[0] == 1e-4
    r = run("suggest-threshold", str(db), "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["source"]["kind"] == "trackio" and doc["source"]["run"] == {"id": "c0f6d109aaaa",
                                                                             "name": "bright-run"}
    assert doc["history"]["nonfinite_steps"] == [300] and doc["history"]["logging_interval"] == 10
    assert (db.read_bytes(), os.stat(db).st_mtime_ns) == before  # opened read-only, left as it was


def test_trackio_runs_are_chosen_with_run(tmp_path, run):
    db = tmp_path / "p.db"
    trackio_project(db, [("aaaa1111", "old", "2026-11-20T10:00:00+00:00", _points(30), 0),
                         ("bbbb2222", "new", "2026-11-21T10:00:00+00:00", _points(40), 0)])
    r = run("suggest-threshold", str(db))
    assert r.exit_code == 2 and "holds 2 Trackio runs with a gradient norm ('new' (bbbb2222" in r.stderr
    assert len(read_norm_log(str(db), run="latest")) == 40
    assert len(read_norm_log(str(db), run="old")) == 30 and len(read_norm_log(str(db), run="aaaa")) == 30
    with pytest.raises(UsageError, match="no run 'nope' among its 2 Trackio runs"):
        read_norm_log(str(db), run="nope")


def test_an_older_trackio_project_without_run_ids(tmp_path):
    db = tmp_path / "p.db"
    trackio_project(db, [(None, "r1", "2025-08-01T10:00:00", _points(30, every=5), 0)], old=True)
    h = read_norm_log(str(db))
    assert h.run.name == "r1" and h.steps == [5 * (i + 1) for i in range(30)]


def test_trackio_rows_without_a_global_step_are_read_by_trackios_step(tmp_path):
    db = tmp_path / "p.db"
    con = sqlite3.connect(db)
    con.executescript(_SCHEMA_043)
    con.executemany("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?, ?, ?, ?, ?)",
                    [("r", "2026-01-01T00:00:00", "r", s, json.dumps({"grad_norm": 1.0 + s}))
                     for s in range(5)])
    con.commit()
    con.close()
    assert read_norm_log(str(db)).steps == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("metrics, message", [
    ("not json", "row 1 of Trackio run 'r' .*holds no JSON object"),
    ("[1, 2]", "row 1 of Trackio run 'r' .*holds no JSON object"),
    ('{"loss": 1.0}', r"no gradient-norm metric .* in its 1 Trackio run\(s\) \(metrics: loss\)"),
    ('{"train/loss": 1.0, "train/learning_rate": 1e-4}',  # a Trainer older than 4.38, or not clipping
     r"metrics: train/learning_rate, train/loss\); .*logs grad_norm from transformers 4.38 on"),
])
def test_damaged_or_normless_trackio_projects_are_input_errors(tmp_path, run, metrics, message):
    db = tmp_path / "p.db"
    con = sqlite3.connect(db)
    con.executescript(_SCHEMA_043)
    con.execute("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) "
                "VALUES ('r', 'x', 'r', 0, ?)", (metrics,))
    con.commit()
    con.close()
    with pytest.raises(InputError, match=message):
        read_norm_log(str(db))
    r = run("suggest-threshold", str(db))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


_SMALL_PROJECT: list[bytes] = []  # made once (see test_mlflow's _SMALL_STORE)


@settings(deadline=None)  # SQLite files written and read: the first example opens sqlite3
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8))
def test_a_corrupted_project_is_read_or_refused_in_one_line(tmp_path_factory, flips):
    if not _SMALL_PROJECT:
        db = tmp_path_factory.mktemp("project") / "p.db"
        trackio_project(db, [("r1", "one", "2026-01-01T00:00:00+00:00", _points(30), 10)])
        _SMALL_PROJECT.append(db.read_bytes())
    read_flipped(tmp_path_factory, _SMALL_PROJECT[0], flips, "p.db", 30)


def test_a_directory_of_databases(tmp_path, run):
    # ~/.cache/huggingface/trackio/ holds one <project>.db per project; MLflow (3.7+) writes mlflow.db in
    # the directory it ran in. One is read; several are a usage error naming them; other SQLite files
    # (an Optuna study) are not logs
    trackio_dir = tmp_path / "trackio"
    trackio_dir.mkdir()
    optuna = sqlite3.connect(trackio_dir / "optuna.db")
    optuna.execute("CREATE TABLE studies (study_id INTEGER, study_name TEXT)")
    optuna.commit()
    optuna.close()
    trackio_project(trackio_dir / "proj-a.db", [("r1", "one", "2026-01-01T00:00:00+00:00", _points(30), 0)])
    (trackio_dir / "proj-a.lock").write_text("")
    h = read_norm_log(str(trackio_dir))
    assert h.kind == "trackio" and h.run.name == "one" and len(h) == 30
    r = run("stats", str(trackio_dir))
    assert r.exit_code == 1 and "it holds training logs (proj-a.db): suggest-threshold reads them" in r.stderr
    trackio_project(trackio_dir / "proj-b.db", [("r2", "two", "2026-01-02T00:00:00+00:00", _points(20), 0)])
    r = run("suggest-threshold", str(trackio_dir))
    assert r.exit_code == 2
    assert "holds 2 MLflow or Trackio databases (proj-a.db, proj-b.db); give one" in r.stderr
    assert len(read_norm_log(str(trackio_dir / "proj-b.db"))) == 20


_row_value = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6),
                       st.sampled_from(["NaN", "Infinity", "-Infinity", "x"]), st.none())


_row_key = st.sampled_from(["grad_norm", "loss", "train/global_step", "lr", "_step"])


_row = st.tuples(st.integers(0, 40), st.dictionaries(_row_key, _row_value, max_size=5),
                 st.sampled_from(["bytes", "str", "pretty", "nan-token"]))


@settings(deadline=None)  # SQLite files written and read: the first example opens sqlite3
@given(rows=st.lists(_row, min_size=1, max_size=25))
def test_decoding_rows_at_once_equals_row_by_row(tmp_path_factory, monkeypatch_module, rows):
    # msgspec's typed rows (the rows read by the compiled reader, or fetched by sqlite3) and decode_lines
    # (gradtool[speedups]) and json.loads per row give the same history or error
    from gradtool.io import compiled, trackio_store

    db = tmp_path_factory.mktemp("t") / "p.db"
    con = sqlite3.connect(db)
    con.executescript(_SCHEMA_043)
    for i, (step, doc, how) in enumerate(rows):
        text = json.dumps({"grad_norm": 1.0 + i, **doc}, indent=1 if how == "pretty" else None,
                          allow_nan=True)
        value = text if how in ("str", "pretty") else text.encode()
        con.execute("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) "
                    "VALUES ('r', 't', 'r', ?, ?)", (step, value))
    con.commit()
    con.close()

    def outcome():
        try:
            h = read_norm_log(str(db))
        except (InputError, UsageError) as exc:
            return type(exc), str(exc)
        return h.steps, [repr(v) for v in h.norms], [repr(v) for v in h.loss], [repr(v) for v in h.lr]

    fastest = outcome()  # typed rows when they fit, else decoded at once, else row by row
    with monkeypatch_module.context() as m:
        m.setattr(compiled, "sqlite_rows", lambda: None)  # the rows fetched by sqlite3, not by C
        assert outcome() == fastest
        m.setattr(trackio_store, "_typed_history", lambda *args: None)
        assert outcome() == fastest
        m.setattr(trackio_store, "_decoded_at_once", lambda blobs: None)
        assert outcome() == fastest


_words = st.sampled_from(["NaN", "Infinity", "-Infinity"])  # Trackio's JSON of nonfinite values
_finite = st.floats(allow_nan=False, allow_infinity=False)
_fitting_values = {"train/grad_norm": _finite | st.integers(-10**6, 10**6) | _words,
                   "train/loss": _finite | st.none() | _words, "train/learning_rate": st.floats(0, 1) | _words,
                   "train/global_step": st.integers(0, 40), "grad_norm": st.floats(0, 10), "lr": st.floats(0, 1),
                   "eval/x": st.text(max_size=3), "train/epoch": st.floats(0, 3), "_step": st.integers(0, 40)}


@st.composite
def _fitting_rows(draw):
    """Rows of one set of keys (the Trainer's every row), or, now and then, each row its own keys."""
    optional = [k for k in _fitting_values if k != "train/grad_norm"]
    shared = draw(st.sets(st.sampled_from(optional)))
    rows = []
    for _ in range(draw(st.integers(1, 30))):
        keys = shared if draw(st.integers(0, 9)) else draw(st.sets(st.sampled_from(optional)))
        doc = {k: draw(_fitting_values[k]) for k in ["train/grad_norm", *sorted(keys)]}
        rows.append((draw(st.integers(-3, 40)), doc))
    return rows


@settings(deadline=None)  # SQLite files written and read: the first example opens sqlite3
@given(rows=_fitting_rows(),
       key=st.sampled_from([None, "grad_norm", "train/grad_norm"]),
       empty=st.none() | st.tuples(st.integers(0, 30), st.sampled_from(["", " "])))
@example(rows=[(1, {"train/grad_norm": "NaN", "train/loss": "Infinity", "train/learning_rate": "-Infinity"}),
               (2, {"train/grad_norm": "Infinity", "train/loss": 2.0, "train/learning_rate": 0.5})], key=None,
         empty=None)
def test_typed_rows_give_what_dict_rows_give(tmp_path_factory, monkeypatch_module, rows, key, empty):
    """Rows that fit one type (how the Trainer logs, nonfinite values as Trackio's words "NaN",
    "Infinity", "-Infinity"; ``empty``: a row of no JSON somewhere): the typed decode answers, and its
    history (steps from the row's own step or train/global_step, several trainings, the keys' order in
    other_keys and notes) is the dict path's, the rows read by the compiled reader or fetched by
    sqlite3."""
    from gradtool.io import compiled, trackio_store

    if empty is not None:
        rows = rows[:empty[0]] + [(0, empty[1])] + rows[empty[0]:]
    db = tmp_path_factory.mktemp("t") / "p.db"
    con = sqlite3.connect(db)
    con.executescript(_SCHEMA_043)
    con.executemany("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES ('r', 't', 'r', ?, ?)",
                    [(step, json.dumps(doc).encode() if isinstance(doc, dict) else doc) for step, doc in rows])
    con.commit()
    con.close()
    answered = []

    def outcome():
        try:
            h = read_norm_log(str(db), key)
        except (InputError, UsageError) as exc:
            return type(exc), str(exc)
        return (h.steps, [repr(v) for v in h.norms], [repr(v) for v in h.loss], [repr(v) for v in h.lr], h.key,
                h.kind, h.other_keys, h.notes)

    with monkeypatch_module.context() as m:
        typed = trackio_store._typed_history
        m.setattr(trackio_store, "_typed_history", lambda *a: answered.append(typed(*a)) or answered[-1])
        fast = outcome()
        m.setattr(compiled, "sqlite_rows", lambda: None)  # the rows fetched by sqlite3, not by C
        assert outcome() == fast
        m.setattr(trackio_store, "_typed_history", lambda *args: None)
        assert outcome() == fast
    if (len({tuple(sorted(doc)) for _, doc in rows}) == 1 and isinstance(rows[0][1], dict)
            and "_step" not in rows[0][1] and (key is None or key in rows[0][1])):
        assert answered and answered[0] is not None  # rows of one set of keys: the typed path read them


@pytest.mark.parametrize("fetch_rows", [1 << 16, 7, 1])
def test_the_typed_path_reads_the_trainers_rows(tmp_path, monkeypatch, fetch_rows):
    """The same history whatever the rows' grouping into fetches (``FETCH_ROWS``: 50 rows in one, in
    pieces of 7 with a last piece of 1, one by one)."""
    db = tmp_path / "p.db"
    trackio_project(db, [("r1", "one", "2026-01-01T00:00:00+00:00", _points(50), 0)])
    from gradtool.io import sqlite_logs, trackio_store

    monkeypatch.setattr(trackio_store, "FETCH_ROWS", fetch_rows)

    def typed():
        with sqlite_logs._opened(str(db), "p.db") as (con, _, _):
            return trackio_store._typed_history(
                lambda: con.execute("SELECT step, metrics FROM metrics WHERE run_id = 'r1' ORDER BY rowid"),
                None, "p.db")

    h = typed()
    assert h is not None and h.kind == "trackio" and h.key == "train/grad_norm"
    assert h.steps == [10 * (i + 1) for i in range(50)] and h.norms == [p for _, p in _points(50)]
    assert h.loss == [3.0 - i / 100 for i in range(50)] and h.lr == [1e-4] * 50
    assert read_norm_log(str(db)).norms == h.norms
    with sqlite3.connect(db) as con:  # an empty row (decode_lines skips its line) past the first rows
        con.execute("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES ('r1', 't', 'one', "
                    "99, '')")
        con.execute("INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) SELECT run_id, timestamp, "
                    "run_name, step + 100, metrics FROM metrics WHERE step < 50")
    assert typed() is None
    with pytest.raises(InputError, match="row 51 of Trackio run 'one' .* holds no JSON object"):
        read_norm_log(str(db))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as m:
        yield m


def test_a_run_name_used_again_holds_two_trainings_and_the_last_is_read(tmp_path):
    # the Trainer's TrackioCallback inits with resume="allow" and its run name defaults to the output
    # directory: training twice appends the second training to the first's run (trackio 0.43 does so)
    db = tmp_path / "p.db"
    first = [(10 * (i + 1), 1.0) for i in range(40)]
    second = [(10 * (i + 1), 3.0) for i in range(25)]
    trackio_project(db, [("r1", "same-name", "2026-01-01T00:00:00+00:00", first + second, 0)])
    h = read_norm_log(str(db))
    assert h.steps == [10 * (i + 1) for i in range(25)] and set(h.norms) == {3.0}
    assert any("it holds 2 trainings" in n for n in h.notes)


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", None, 1]), st.sampled_from(["x", "y", "é"]),
                          st.sampled_from(["2026-01-02T00:00:00", "2026-01-01T00:00:00", "t"])), max_size=12))
def test_the_runs_of_a_project_are_those_grouping_gives(rows):
    """One run read by a plain aggregate, several by grouping: the same (run, name, start) either way."""
    from gradtool.io.trackio_store import _runs

    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE metrics (run_id, timestamp, run_name, step, metrics)")
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, 0, '{}')", [(r, t, n) for r, n, t in rows])
    assert _runs(con, "run_id") == con.execute(
        "SELECT run_id, MIN(run_name), MIN(timestamp) FROM metrics GROUP BY run_id ORDER BY MIN(rowid)").fetchall()


@pytest.mark.parametrize("old", [False, True])
@pytest.mark.parametrize("runs", [1, 3])
def test_no_query_reads_a_runs_rows_through_trackios_indexes(tmp_path, monkeypatch, old, runs):
    """Trackio indexes metrics by run; a query that took a run's rows through such an index would look
    every row up and sort them all again (10^6 rows: 2.4 s against 0.46 s for one scan in rowid order).
    Every statement the reader runs (the compiled reader off, so that sqlite3 runs them all) reads the
    table by a scan or by a covering index only."""
    db = tmp_path / "p.db"
    trackio_project(db, [(f"r{i}", f"run-{i}", "2026-01-01T00:00:00+00:00", _points(30), 0)
                         for i in range(runs)], old=old)
    statements = []
    connect = sqlite3.connect

    def traced(*args, **kwargs):
        con = connect(*args, **kwargs)
        con.set_trace_callback(statements.append)
        return con

    monkeypatch.setattr(sqlite3, "connect", traced)
    monkeypatch.setenv("GRADTOOL_NO_KERNELS", "1")
    h = read_norm_log(str(db), run=None if runs == 1 else "run-1")
    assert len(h.norms) == 30
    monkeypatch.undo()
    plans = []
    with sqlite3.connect(db) as con:
        for sql in statements:
            if sql.lstrip().upper().startswith("SELECT") and " metrics" in sql:
                plans += [(sql, row[3]) for row in con.execute("EXPLAIN QUERY PLAN " + sql)]
    assert any("NOT INDEXED" in sql for sql, _ in plans)  # the run's rows were read by these statements
    assert [(sql, plan) for sql, plan in plans if "USING INDEX" in plan] == []
