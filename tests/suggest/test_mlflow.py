"""MLflow tracking stores as norm histories: the SQLite store (mlflow.db, MLflow's default since 3.7) and
the file store (mlruns/). The Hugging Face Trainer logs grad_norm, loss and learning_rate to MLflow at
every logging step whenever mlflow is installed; both stores were refused ("binary file", "directory holds
no gradient dumps ..."). The fixtures write what MLflow 3.17 writes (checked against real stores made by
mlflow.log_metrics; mlflow itself is not a test dependency)."""

from __future__ import annotations

import json
import math
import os
import sqlite3

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.errors import InputError, UsageError
from gradtool.io.logs import read_norm_log
from gradtool.io.mlflow_store import (DBL_MAX, _columns_compiled, _columns_msgspec, history_of_run,
                                      parse_metric_lines, parse_metric_lines_plain)
from tests.damaged import read_flipped

T0 = 1795521146861  # a start time in ms, as MLflow writes them


def _norm(step):
    return 1.0 + (step % 7) / 10


# ---- the file store -------------------------------------------------------------------------------------
def file_run(root, run_id, name, start, metrics, experiment="0", deleted=False):
    """A run as MLflow's file store lays it out: meta.yaml, metrics/<key> (nested for keys with /),
    tags/mlflow.runName. ``metrics``: key -> [(step, value)], logged 1 ms apart."""
    d = root / experiment / run_id
    (d / "metrics").mkdir(parents=True)
    (d / "tags").mkdir()
    (d / "artifacts").mkdir()
    (d / "meta.yaml").write_text(
        f"artifact_uri: {d}/artifacts\nend_time: {start + 99999}\nentry_point_name: ''\n"
        f"experiment_id: '{experiment}'\nlifecycle_stage: {'deleted' if deleted else 'active'}\n"
        f"run_id: {run_id}\nrun_name: {name}\nsource_name: ''\nsource_type: 4\nsource_version: ''\n"
        f"start_time: {start}\nstatus: 3\ntags: []\nuser_id: root\n")
    (d / "tags" / "mlflow.runName").write_text(name)
    for key, points in metrics.items():
        f = d / "metrics" / key
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("".join(f"{start + i} {v!r} {s}\n" for i, (s, v) in enumerate(points)))
    return d


def hf_metrics(n, offset=0.0):
    """What the Trainer logs per logging step."""
    steps = range(1, n + 1)
    return {"grad_norm": [(s, _norm(s) + offset) for s in steps], "loss": [(s, 3 - s / 100) for s in steps],
            "learning_rate": [(s, 1e-4 * s) for s in steps], "epoch": [(s, s / 10) for s in steps]}


def test_a_file_store_run_is_read_from_any_level(tmp_path, run):
    root = tmp_path / "mlruns"
    d = file_run(root, "93e592b2537c4b84a16f4f55fcd2987c", "first-run", T0, hf_metrics(40))
    (root / ".trash").mkdir()
    for where in (root, root / "0", d, d / "metrics", d / "metrics" / "grad_norm"):
        h = read_norm_log(str(where))
        assert (h.kind, h.key, h.steps) == ("mlflow", "grad_norm", list(range(1, 41))), where
        assert h.norms == [_norm(s) for s in range(1, 41)]
        assert h.loss == [3 - s / 100 for s in range(1, 41)] and h.lr == [1e-4 * s for s in range(1, 41)]
        assert (h.run.id, h.run.name) == ("93e592b2537c4b84a16f4f55fcd2987c", "first-run")
    r = run("suggest-threshold", str(root), "--format", "json")
    assert r.exit_code == 0, r.stderr
    src = r.json()["source"]
    assert (src["kind"], src["key"]) == ("mlflow", "grad_norm")
    assert src["run"] == {"id": "93e592b2537c4b84a16f4f55fcd2987c", "name": "first-run"}
    table = run("suggest-threshold", str(root))
    assert "(mlflow, run first-run, key grad_norm)" in table.stdout
    np.savez(d / "artifacts" / "model.npz", w=np.ones(3))  # a run's logged artifact is no step of dumps
    (d / "artifacts" / "notes").mkdir()
    r = run("suggest-threshold", str(d), "--format", "json")
    assert r.exit_code == 0 and r.json()["source"]["kind"] == "mlflow" and r.json()["history"]["n"] == 40


def test_several_runs_are_listed_newest_first_and_chosen_with_run(tmp_path, run):
    root = tmp_path / "mlruns"
    file_run(root, "a1b2c3d4e5f60718293a4b5c6d7e8f90", "bright-owl-7", T0, hf_metrics(30))
    file_run(root, "ffff0000aaaa1111bbbb2222cccc3333", "calm-fox-2", T0 + 86_400_000, hf_metrics(20, 1.0))
    file_run(root, "dead0000aaaa1111bbbb2222cccc3333", "gone", T0 + 2 * 86_400_000, hf_metrics(10),
             deleted=True)
    file_run(root, "0000aaaa1111bbbb2222cccc33334444", "eval-only", T0 + 3 * 86_400_000,
             {"eval_loss": [(1, 2.0)]}, experiment="7")
    with pytest.raises(UsageError, match=r"holds 2 MLflow runs with a gradient norm \('calm-fox-2' "
                                         r"\(ffff0000, 2026-11-.*\), 'bright-owl-7' \(a1b2c3d4, .*\)\); "
                                         r"choose one with --run"):
        read_norm_log(str(root))
    for wanted, n in (("bright-owl-7", 30), ("calm-fox-2", 20), ("latest", 20),
                      ("a1b2c3d4e5f60718293a4b5c6d7e8f90", 30), ("a1b2", 30), ("ffff", 20)):
        assert len(read_norm_log(str(root), run=wanted)) == n, wanted
    for wanted, message in (("gone", "no run 'gone' among its 3 MLflow runs \\('eval-only'"),  # deleted
                            ("eval-only", "run 'eval-only' .* has no gradient-norm metric .*eval_loss"),
                            ("nope", "no run 'nope'")):
        with pytest.raises((UsageError, InputError), match=message):
            read_norm_log(str(root), run=wanted)
    r = run("suggest-threshold", str(root))
    assert r.exit_code == 2 and "--run NAME, --run ID or --run latest" in r.stderr and r.stdout == ""
    r = run("suggest-threshold", str(root), "--run", "calm-fox-2", "--format", "json")
    assert r.exit_code == 0 and r.json()["history"]["n"] == 20
    assert r.json()["source"]["run"]["name"] == "calm-fox-2"


def test_two_runs_of_one_name_are_chosen_by_id(tmp_path):
    root = tmp_path / "mlruns"
    file_run(root, "aaaa0000aaaa1111bbbb2222cccc3333", "same", T0, hf_metrics(10))
    file_run(root, "bbbb0000aaaa1111bbbb2222cccc3333", "same", T0 + 1000, hf_metrics(12))
    with pytest.raises(UsageError, match="2 MLflow runs are named 'same' .*; choose one by its ID"):
        read_norm_log(str(root), run="same")
    assert len(read_norm_log(str(root), run="bbbb")) == 12


def test_a_metric_file_given_by_itself(tmp_path, run):
    root = tmp_path / "mlruns"
    d = file_run(root, "93e592b2537c4b84a16f4f55fcd2987c", "r", T0,
                 {"train/grad_norm": [(s, _norm(s)) for s in range(1, 21)],
                  "loss": [(s, 2.0) for s in range(1, 21)]})
    h = read_norm_log(str(d / "metrics" / "train" / "grad_norm"))
    assert (h.key, len(h), h.loss[0]) == ("train/grad_norm", 20, 2.0)
    with pytest.raises(InputError, match=r"metrics/loss: is the MLflow metric 'loss', not a gradient norm; "
                                         r".*--key loss"):
        read_norm_log(str(d / "metrics" / "loss"))
    assert read_norm_log(str(d / "metrics" / "loss"), key="loss").norms == [2.0] * 20
    copy = tmp_path / "grad_norm"  # a copy outside its run: the norm alone
    copy.write_bytes((d / "metrics" / "train" / "grad_norm").read_bytes())
    h = read_norm_log(str(copy))
    assert (h.key, h.steps, h.run, h.has_loss) == ("grad_norm", list(range(1, 21)), None, False)
    r = run("suggest-threshold", "-", "--format", "json", input=copy.read_bytes())
    assert r.exit_code == 0, r.stderr
    assert r.json()["history"]["n"] == 20 and r.json()["source"]["kind"] == "mlflow"


def test_file_store_values_as_mlflow_writes_them(tmp_path):
    """nan/inf as str(float) writes them; a step logged again (a resumed run) keeps the value logged last;
    a metric logged without a step (mlflow.log_metric(k, v)) is in logging order, said in a note."""
    f = tmp_path / "grad_norm"
    f.write_text(f"{T0} 1.5 1\n{T0 + 1} nan 2\n{T0 + 2} inf 3\n{T0 + 3} 2.5 2\n\n{T0 + 4} -inf 4\n")
    h = read_norm_log(str(f))
    assert h.steps == [1, 2, 3, 4] and h.norms[0] == 1.5 and h.norms[1] == 2.5
    assert h.norms[2] == math.inf and h.norms[3] == -math.inf
    f.write_text(f"{T0 + 5} 3.0\n{T0} 1.0\n{T0 + 2} 2.0\n")
    h = read_norm_log(str(f))
    assert (h.steps, h.norms, h.line_order) == ([0, 1, 2], [1.0, 2.0, 3.0], True)
    assert "logged without steps" in h.notes[0]


@pytest.mark.parametrize("line", ["1795521146861 1.5 two", "1795521146861 1.5 3 4", "1795521146861 x 3"])
def test_a_malformed_metric_line_is_named(tmp_path, line):
    f = tmp_path / "grad_norm"
    f.write_text(f"{T0} 1.0 1\n{line}\n{T0} 1.0 3\n")
    with pytest.raises(InputError, match=r"grad_norm: line 2 is not an MLflow metric line"):
        read_norm_log(str(f))


_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6).map(float))


@given(st.lists(st.tuples(st.integers(0, 50), _values, st.booleans()), min_size=1, max_size=60))
def test_parse_and_history_match_a_plain_reference(points):
    """The columns-at-once parse and the dedup by (step, time) equal a line-by-line float64 reference;
    ``drop`` leaves a line's step out (MLflow reads it as step 0), which takes the per-line path."""
    lines = [f"{T0 + i} {v!r}" + ("" if drop else f" {s}") for i, (s, v, drop) in enumerate(points)]
    steps, stamps, values = parse_metric_lines("\n".join(lines) + "\n", "x")
    ref = [(0 if drop else s, T0 + i, v) for i, (s, v, drop) in enumerate(points)]
    assert steps.tolist() == [r[0] for r in ref] and stamps.tolist() == [r[1] for r in ref]
    assert [repr(v) for v in values.tolist()] == [repr(float(r[2])) for r in ref]
    h = history_of_run({"g": (steps, stamps, values)}, "g", None, None, "x", None)
    if len(set(steps.tolist())) == 1 and len(ref) > 1:
        assert h.steps == list(range(len(ref))) and h.line_order
        assert [repr(v) for v in h.norms] == [repr(float(r[2])) for r in ref]
    else:
        last = {}
        for s, _, v in ref:
            last[s] = float(v)  # logged later wins
        assert h.steps == sorted(last) and [repr(v) for v in h.norms] == [repr(last[s]) for s in sorted(last)]


# ---- the SQLite store -----------------------------------------------------------------------------------
_SCHEMA = """
CREATE TABLE experiments (experiment_id INTEGER NOT NULL, name VARCHAR(256) NOT NULL,
    artifact_location VARCHAR(256), lifecycle_stage VARCHAR(32), creation_time BIGINT,
    last_update_time BIGINT, CONSTRAINT experiment_pk PRIMARY KEY (experiment_id));
CREATE TABLE runs (run_uuid VARCHAR(32) NOT NULL, name VARCHAR(250), source_type VARCHAR(20),
    source_name VARCHAR(500), entry_point_name VARCHAR(50), user_id VARCHAR(256), status VARCHAR(9),
    start_time BIGINT, end_time BIGINT, source_version VARCHAR(50), lifecycle_stage VARCHAR(20),
    artifact_uri VARCHAR(200), experiment_id INTEGER, deleted_time BIGINT,
    CONSTRAINT run_pk PRIMARY KEY (run_uuid));
CREATE TABLE metrics ("key" VARCHAR(250) NOT NULL, value FLOAT NOT NULL, timestamp BIGINT NOT NULL,
    run_uuid VARCHAR(32) NOT NULL, step BIGINT DEFAULT '0' NOT NULL, is_nan BOOLEAN DEFAULT '0' NOT NULL,
    CONSTRAINT metric_pk PRIMARY KEY ("key", timestamp, step, run_uuid, value, is_nan));
CREATE TABLE latest_metrics ("key" VARCHAR(250) NOT NULL, value FLOAT NOT NULL, timestamp BIGINT,
    step BIGINT NOT NULL, is_nan BOOLEAN NOT NULL, run_uuid VARCHAR(32) NOT NULL,
    CONSTRAINT latest_metric_pk PRIMARY KEY ("key", run_uuid));
"""


def sql_store(path, runs):
    """An MLflow SQLite store: runs = [(run_id, name, start, lifecycle, {key: [(step, value)]})], values
    stored as MLflow's SQL store stores them (NaN: 0 with is_nan; +-Inf: +-DBL_MAX)."""
    con = sqlite3.connect(path)
    con.executescript(_SCHEMA)
    con.execute("INSERT INTO experiments VALUES (0, 'Default', '', 'active', 0, 0)")
    for rid, name, start, stage, metrics in runs:
        con.execute("INSERT INTO runs (run_uuid, name, status, start_time, lifecycle_stage, experiment_id) "
                    "VALUES (?, ?, 'FINISHED', ?, ?, 0)", (rid, name, start, stage))
        for key, points in metrics.items():
            for i, (s, v) in enumerate(points):
                stored = 0.0 if math.isnan(v) else math.copysign(DBL_MAX, v) if math.isinf(v) else v
                con.execute("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?)",
                            (key, stored, start + i, rid, s, int(math.isnan(v))))
            s, v = points[-1]
            con.execute("INSERT INTO latest_metrics VALUES (?, 0, 0, ?, 0, ?)", (key, s, rid))
    con.commit()
    con.close()


def test_an_mlflow_sqlite_store(tmp_path, run):
    db = tmp_path / "mlflow.db"
    m = hf_metrics(40)
    m["grad_norm"][9] = (10, math.nan)
    m["grad_norm"][10] = (11, math.inf)
    m["grad_norm"].append((20, 9.0))  # step 20 logged again, later (a resumed run)
    sql_store(db, [("0b55e9d817cc4dab8545011f0d3487da", "first-run", T0, "active", m),
                   ("e33c8d4d00000000000000000000aaaa", "removed", T0 + 5000, "deleted", hf_metrics(5))])
    before = (db.read_bytes(), os.stat(db).st_mtime_ns)
    h = read_norm_log(str(db))
    assert (h.kind, h.key, h.steps, h.run.name) == ("mlflow", "grad_norm", list(range(1, 41)), "first-run")
    assert math.isnan(h.norms[9]) and h.norms[10] == math.inf and h.norms[19] == 9.0
    ref = [_norm(s) for s in range(1, 41)]
    assert [v for i, v in enumerate(h.norms) if i not in (9, 10, 19)] == [v for i, v in enumerate(ref)
                                                                           if i not in (9, 10, 19)]
    assert h.loss == [3 - s / 100 for s in range(1, 41)] and h.lr == [1e-4 * s for s in range(1, 41)]
    assert (db.read_bytes(), os.stat(db).st_mtime_ns) == before  # read-only
    assert sorted(os.listdir(tmp_path)) == ["mlflow.db"]
    r = run("suggest-threshold", str(db), "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    assert doc["source"]["run"]["name"] == "first-run" and doc["history"]["nonfinite_steps"] == [10, 11]
    with pytest.raises(UsageError, match="no run 'removed'"):
        read_norm_log(str(db), run="removed")


def test_several_runs_in_an_sqlite_store(tmp_path, run):
    db = tmp_path / "mlflow.db"
    sql_store(db, [("aaaa1111", "old", T0, "active", hf_metrics(10)),
                   ("bbbb2222", "new", T0 + 60_000, "active", hf_metrics(15)),
                   ("cccc3333", "no-norm", T0 + 120_000, "active", {"loss": [(1, 1.0)]})])
    r = run("suggest-threshold", str(db))
    assert r.exit_code == 2 and "holds 2 MLflow runs with a gradient norm ('new' (bbbb2222" in r.stderr
    assert len(read_norm_log(str(db), run="latest")) == 15  # the latest with a norm... is 'new'
    assert len(read_norm_log(str(db), run="aaaa")) == 10
    with pytest.raises(InputError, match="run 'no-norm' .* has no gradient-norm metric"):
        read_norm_log(str(db), run="no-norm")
    with pytest.raises(UsageError, match="no metric 'gnorm'"):
        read_norm_log(str(db), key="gnorm", run="old")


@pytest.mark.parametrize("content, message", [
    (b"SQLite format 3\x00" + b"\x10\x00" + b"\xff" * 200, "cannot (open|read) the"),  # corrupt
    (None, "an SQLite database, but not an MLflow tracking store"),
])
def test_sqlite_files_that_are_no_mlflow_store(tmp_path, run, content, message):
    db = tmp_path / "other.db"
    if content is None:
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE t (x)")
        con.commit()
        con.close()
    else:
        db.write_bytes(content)
    r = run("suggest-threshold", str(db))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"gradtool: error: {db}: ") and __import__("re").search(message, r.stderr)
    r = run("stats", str(db))
    assert r.exit_code == 1 and "is an SQLite database (an MLflow tracking store or a Trackio" in r.stderr


def test_run_needs_a_store_of_runs(tmp_path, run):
    csv = tmp_path / "m.csv"
    csv.write_text("step,grad_norm\n" + "".join(f"{s},{_norm(s)}\n" for s in range(1, 30)))
    r = run("suggest-threshold", str(csv), "--run", "x")  # a CSV's runs are W&B export columns: none here
    assert r.exit_code == 2 and f"{csv}: holds no runs in its columns ('RUN - metric')" in r.stderr
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {s} | grad_norm: {_norm(s)}\n" for s in range(1, 30)))
    r = run("suggest-threshold", str(log), "--run", "x")
    assert r.exit_code == 2 and "--run x: no input is a store of runs" in r.stderr
    dump = tmp_path / "d.npz"
    np.savez(dump, w=np.ones(3, dtype=np.float32))
    r = run("suggest-threshold", str(dump), "--run", "x")
    assert r.exit_code == 2 and "--run x: no input is a store of runs" in r.stderr


def test_lines_of_two_and_four_fields_are_not_taken_for_three(tmp_path):
    """Six fields on two lines are not two lines of three: the columns-at-once parse checks each line."""
    f = tmp_path / "grad_norm"
    f.write_text(f"{T0} 1.0\n{T0 + 1} 2 7 8\n")  # by columns: timestamps T0, 2; steps T0 + 1, 8
    with pytest.raises(InputError, match="line 2 is not an MLflow metric line"):
        read_norm_log(str(f))


def test_a_resumed_runs_loss_is_the_later_one_whatever_the_row_order():
    """SQLite returns rows in no promised order: a step's loss logged twice is the later by timestamp."""
    steps = np.arange(1, 31)
    norm = (steps, T0 + steps, np.ones(30))
    later_first = np.concatenate([T0 + 100 + steps, T0 + steps])
    loss = (np.concatenate([steps, steps]), later_first,
            np.concatenate([np.full(30, 1.0), np.full(30, 9.0)]))
    h = history_of_run({"grad_norm": norm, "loss": loss}, "grad_norm", "loss", None, "x", None)
    assert h.loss == [1.0] * 30


_series = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 5), _values), max_size=40)


@given(_series.filter(bool), _series, st.booleans())
def test_loss_matched_to_the_norm_steps_equals_a_dict_reference(norm_points, loss_points, one_step):
    """Each norm step's loss is the loss logged last at that step (by timestamp, then by row), None where
    none was logged; with every norm at one step (logged without steps) the match is by timestamp."""
    def series(points, same_step):
        steps = np.array([0 if same_step else s for s, _, _ in points], dtype=np.int64)
        stamps = np.array([T0 + t for _, t, _ in points], dtype=np.int64)
        return steps, stamps, np.array([v for _, _, v in points], dtype=np.float64)

    norm, loss = series(norm_points, one_step), series(loss_points, one_step)
    h = history_of_run({"g": norm, "loss": loss}, "g", "loss", None, "x", None)
    line_order = len(norm_points) > 1 and len(set(norm[0].tolist())) == 1
    by_key = loss[1] if line_order else loss[0]
    ref: dict[int, float] = {}
    for k, _, i in sorted((k, t, i) for i, (k, t) in enumerate(zip(by_key.tolist(), loss[1].tolist()))):
        ref[k] = loss[2][i].item()  # the later timestamp, then the later row, wins
    keys = (np.array(sorted(set(norm[1].tolist()))) if line_order else np.array(sorted(set(norm[0].tolist()))))
    want = [ref.get(k) for k in keys.tolist()]
    assert [repr(x) for x in h.loss] == [repr(x) for x in want]


_rows = st.lists(st.tuples(st.integers(0, 12), _values), max_size=30)


@settings(deadline=None, max_examples=60)  # SQLite files written and read
@given(_rows.filter(bool), _rows, st.booleans(), st.randoms(use_true_random=False))
def test_an_sqlite_store_reads_as_its_series_with_timestamps(tmp_path_factory, norm_rows, loss_rows,
                                                             one_step, rnd):
    """The store's rows read as history_of_run of their full (step, timestamp, value) series, the
    reference: the timestamps are left out only where they order nothing (distinct steps), and read when
    a step repeats or the norm was logged without steps (the loss then matched by timestamp). Rows go in
    shuffled; each (step, timestamp) of a metric is distinct, as a real run's are."""
    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    con = sqlite3.connect(db)
    con.executescript(_SCHEMA)
    con.execute("INSERT INTO runs (run_uuid, name, start_time, lifecycle_stage) VALUES ('r1', 'x', ?, "
                "'active')", (T0,))
    series = {}
    for key, rows in (("grad_norm", norm_rows), ("loss", loss_rows)):
        stamps = rnd.sample(range(1000), len(rows))
        full = [(0 if one_step else s, T0 + t, math.copysign(math.inf, v) if abs(v) == DBL_MAX else v + 0.0)
                for (s, v), t in zip(rows, stamps)]  # +-DBL_MAX is MLflow's +-Inf; SQLite keeps no -0.0
        series[key] = tuple(np.array(c, dtype=d) for c, d in zip(zip(*full), (np.int64, np.int64, float))) \
            if full else (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        rnd.shuffle(full)
        con.executemany("INSERT INTO metrics VALUES (?, ?, ?, 'r1', ?, ?)",
                        [(key, 0.0 if math.isnan(v) else math.copysign(DBL_MAX, v) if math.isinf(v) else v,
                          t, s, int(math.isnan(v))) for s, t, v in full])
    con.commit()
    con.close()
    h = read_norm_log(str(db))
    ref = history_of_run(series, "grad_norm", "loss" if loss_rows else None, None, "x", None)
    assert (h.steps, h.line_order) == (ref.steps, ref.line_order)
    assert [repr(v) for v in h.norms] == [repr(v) for v in ref.norms]
    assert [repr(v) for v in h.loss or []] == [repr(v) for v in ref.loss or []]


@pytest.mark.parametrize("row", [("grad_norm", "abc", T0 + 99, "r1", 99, 0),
                                 ("grad_norm", 1.0, T0 + 99, "r1", None, 0),
                                 ("grad_norm", 1.0, "soon", "r1", 29, 0)])
def test_a_tampered_metrics_row_is_an_input_error(tmp_path, run, row):
    """(A timestamp is read when it orders something: the tampered one is at a step logged twice.)"""
    db = tmp_path / "mlflow.db"
    sql_store(db, [("r1", "x", T0, "active", hf_metrics(30))])
    con = sqlite3.connect(db)
    con.execute("DROP TABLE metrics")  # without its NOT NULL and types, as a hostile file may be
    con.execute('CREATE TABLE metrics ("key", value, timestamp, run_uuid, step, is_nan)')
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, ?, ?)",
                    [("grad_norm", 1.0, T0 + s, "r1", s, 0) for s in range(30)] + [row])
    con.commit()
    con.close()
    r = run("suggest-threshold", str(db))
    assert r.exit_code == 1 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert "metric 'grad_norm' of run 'x' (r1, " in r.stderr and "is not a number" in r.stderr


def test_a_view_named_metrics_is_not_queried(tmp_path, run):
    """Only tables are read: a view (which could run any query, e.g. an endless recursive one) is not."""
    db = tmp_path / "mlflow.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE runs (run_uuid, name, start_time, lifecycle_stage)")
    con.execute("CREATE VIEW metrics AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                "SELECT 'grad_norm' AS key, x AS value, x AS timestamp, 'r' AS run_uuid, x AS step, "
                "0 AS is_nan FROM c")
    con.commit()
    con.close()
    r = run("suggest-threshold", str(db))
    assert r.exit_code == 1 and "not an MLflow tracking store" in r.stderr


@pytest.mark.parametrize("line", [f"{2**63} 1.0 1", f"{T0} 1.0 {2**63}", f"{T0} 1.0 -{2**63 + 1}"])
def test_a_step_or_timestamp_beyond_int64_is_an_input_error_naming_the_line(tmp_path, run, line):
    """Found with the msgspec parse's property test: such a line raised OverflowError (a traceback)."""
    run_dir = tmp_path / "mlruns" / "0" / "r1"
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "meta.yaml").write_text("run_id: r1\n")
    (run_dir / "metrics" / "grad_norm").write_text(f"{T0} 1.0 0\n{line}\n")
    r = run("suggest-threshold", str(run_dir))
    assert r.exit_code == 1 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    assert "grad_norm: line 2 is not an MLflow metric line" in r.stderr


_odd = st.sampled_from(["-0", "-0.0", "0", "1e3", "1E-5", "01", "1.", ".5", "+1", "nan", "inf", "-inf", "1_0",
                        "9" * 400, "1e400", str(2**63), str(-2**63), '"1"'])
_int_token = st.one_of(st.integers(-2**63, 2**63 - 1).map(str), st.integers(0, 10**6).map(str), _odd)
_value_token = st.one_of(_values.map(repr), st.integers(-10**20, 10**20).map(str), _odd)


@pytest.mark.parametrize("columns", [_columns_msgspec, _columns_compiled])
@given(st.lists(st.tuples(_int_token, _value_token, _int_token), min_size=1, max_size=6), st.booleans(),
       st.booleans())
@example([(str(T0), "-0", "1"), (str(T0), "-0.0", "-0")], False, True)  # msgspec reads -0 as +0
@example([(str(T0), "nan", "1"), (str(T0), "inf", "2"), (str(T0), "-inf", "3")], False, True)  # quoted
@example([(str(T0), "-nan", "1"), (str(T0), "infinity", "2")], False, True)  # no JSON once quoted
@example([(str(T0), '"1"', "1")], False, True)  # a string that is not one of the words
def test_the_fast_parses_equal_the_plain_one_when_they_answer(columns, fields, crlf, last_break):
    """``_columns_msgspec`` (JSON numbers) and ``_columns_compiled`` (gradtool/io/_logscan.c) give what
    splitting and ``int``/``float`` give, or None."""
    end = "\r\n" if crlf else "\n"
    text = end.join(" ".join(f) for f in fields) + (end if last_break else "")
    fast = columns(text.encode("utf-8", "replace"))
    try:
        plain = parse_metric_lines_plain(text, "m")
    except InputError:
        assert fast is None
        return
    if fast is not None:
        assert [a.dtype for a in fast] == [a.dtype for a in plain]
        assert [[repr(x) for x in a.tolist()] for a in fast] == [[repr(x) for x in a.tolist()] for a in plain]


@pytest.mark.parametrize("columns", [_columns_msgspec, _columns_compiled])
def test_the_fast_parses_take_what_mlflow_writes(columns):
    import importlib.util

    if columns is _columns_compiled and (importlib.util.find_spec("gradtool.io._logscan") is None
                                         or os.environ.get("GRADTOOL_NO_KERNELS")):
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    lines = [f"{T0 + i} {v!r} {i}" for i, v in enumerate([0.5, 2.0, 1e-300, 3.25e10, -0.0, math.nan, -math.inf])]
    cols = columns(("\n".join(lines) + "\n").encode())
    assert cols is not None and cols[0].tolist() == list(range(7)) and cols[1][0] == T0
    assert [repr(v) for v in cols[2].tolist()] == ["0.5", "2.0", "1e-300", "32500000000.0", "-0.0", "nan", "-inf"]


@given(st.text(alphabet=st.sampled_from("0123456789 .-+einfa\n\r\tx"), max_size=300))
def test_any_metric_text_parses_or_is_an_input_error(text):
    try:
        steps, stamps, values = parse_metric_lines(text, "m")
    except InputError as exc:
        assert str(exc).startswith("m: line ")
    else:
        assert len(steps) == len(stamps) == len(values)


@settings(deadline=None)  # SQLite files written and read: the first example opens sqlite3
@given(st.binary(max_size=2000))
def test_any_bytes_after_the_sqlite_magic_are_an_input_error(tmp_path_factory, tail):
    db = tmp_path_factory.mktemp("db") / "mlflow.db"
    db.write_bytes(b"SQLite format 3\x00" + tail)
    with pytest.raises(InputError, match=r"mlflow.db: "):
        read_norm_log(str(db))


_SMALL_STORE: list[bytes] = []  # made once; not a fixture, whose 100 kB repr hypothesis would print


def _small_store(tmp_path_factory):
    if not _SMALL_STORE:
        db = tmp_path_factory.mktemp("store") / "mlflow.db"
        sql_store(db, [("r1", "one", T0, "active", hf_metrics(30))])
        _SMALL_STORE.append(db.read_bytes())
    return _SMALL_STORE[0]


@settings(deadline=None)  # SQLite files written and read: the first example opens sqlite3
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8))
def test_a_corrupted_store_is_read_or_refused_in_one_line(tmp_path_factory, flips):
    """Found by it: a damaged run name was a UnicodeDecodeError traceback (sqlite3 decodes text strictly)."""
    read_flipped(tmp_path_factory, _small_store(tmp_path_factory), flips, "mlflow.db", 30)


def test_the_directory_mlflow_ran_in(tmp_path, run):
    """MLflow 3.7+ writes mlflow.db in the directory it runs in: that directory reads as the store."""
    sql_store(tmp_path / "mlflow.db", [("r1", "one", T0, "active", hf_metrics(30))])
    (tmp_path / "train.py").write_text("print('hi')\n")
    r = run("suggest-threshold", str(tmp_path), "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["source"]["kind"] == "mlflow" and json.loads(r.stdout)["history"]["n"] == 30
