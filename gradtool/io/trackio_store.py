"""Trackio projects as gradient-norm histories.

Trackio (Hugging Face's local experiment tracker) keeps a project in one SQLite file,
``$HF_HOME/trackio/<project>.db`` (``~/.cache/huggingface/trackio/``), whose table ``metrics`` holds one
row per ``trackio.log`` call: ``run_id`` (newer versions; before, the run is ``run_name``), ``run_name``,
``step`` (Trackio's own counter when the caller gives none), ``timestamp`` (ISO 8601) and ``metrics``, a
JSON object (text or bytes) with NaN and ±Inf as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
The Hugging Face Trainer's ``report_to="trackio"`` logs ``train/grad_norm``, ``train/loss``,
``train/learning_rate`` and ``train/global_step`` there. Read with the standard library's sqlite3 (see
:mod:`~gradtool.io.sqlite_logs`), never through trackio.
"""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime
from collections.abc import Callable
from functools import cache
from typing import Any

from ..errors import InputError
from .runs import Run, choose_run_with_norm

TRACKIO_COLUMNS = {"run_name", "step", "metrics"}


def is_trackio_project(con: Any, tables: set[str]) -> bool:
    """True when the database ``con`` (whose tables are ``tables``) has Trackio's ``metrics`` table."""
    if "metrics" not in tables:
        return False
    return TRACKIO_COLUMNS <= {str(row[1]) for row in con.execute("PRAGMA table_info(metrics)")}


KEY_SAMPLE_ROWS = 500  # a run's metric names are taken from its first rows (the Trainer logs its norm in
# every training row): choosing a run decodes this many rows of each, not every row of every run


def read_trackio_project(con: Any, key: str | None, run: str | None, source: str,
                         uri: str | None = None) -> Any:
    """The norm history of one run of the Trackio project ``con``: the only run that logged a gradient
    norm, or the one ``run`` names (see :func:`~gradtool.io.runs.choose_run`). A row's own step comes
    last (as ``_step``, W&B's name for such a counter): ``train/global_step``, logged by the Hugging Face
    Trainer in every row, is the training step. Only the chosen run's rows are all read; ``uri``: the
    database's, for the compiled reader of rows (see :func:`_typed_history`)."""
    from .logs import from_records

    columns = {str(row[1]) for row in con.execute("PRAGMA table_info(metrics)")}
    by = "run_id" if "run_id" in columns else "run_name"
    runs = [Run(str(rid), str(name), _seconds(first), str(rid)) for rid, name, first in _runs(con, by)]

    def rows_of(r: Run, limit: int = -1) -> list[tuple[Any, Any, Any]]:  # (rowid, step, metrics JSON)
        return con.execute(f"SELECT rowid, step, metrics FROM metrics NOT INDEXED WHERE {by} = ? "
                           "ORDER BY rowid LIMIT ?", (r.where, limit)).fetchall()

    def records(r: Run, rows: list[tuple[Any, Any, Any]]) -> list[dict[str, Any]]:
        docs = _decoded_at_once([m for _, _, m in rows])
        if docs is None:
            return [_record(rowid, step, metrics, r, source) for rowid, step, metrics in rows]
        return [_record(rowid, step, doc, r, source, decoded=True)
                for (rowid, step, _), doc in zip(rows, docs, strict=True)]

    @cache
    def keys(r: Run) -> list[str]:  # its metric names (the row's own step, "_step", is none)
        names = dict.fromkeys(k for rec in records(r, rows_of(r, KEY_SAMPLE_ROWS)) for k in rec)
        return [k for k in names if k != "_step"]

    chosen = choose_run_with_norm(runs, keys, key, run, source, "Trackio", "a Trackio project")
    sql = f"SELECT step, metrics FROM metrics NOT INDEXED WHERE {by} = ? ORDER BY rowid"
    try:
        hist = _typed_history(lambda: con.execute(sql, (chosen.where,)), key, source,
                              None if uri is None else (uri, sql, chosen.where)) \
            or from_records(records(chosen, rows_of(chosen)), source, "trackio", key)
    except InputError as exc:
        raise InputError(f"{source}: run {chosen.label()}: {str(exc).removeprefix(source + ': ')}") from None
    hist.run = chosen
    return hist


def _runs(con: Any, by: str) -> list[tuple[Any, Any, Any]]:
    """(run, its least run name, its first timestamp) of each run of the project, runs in the order they
    first appear. A project of one run is read by a plain aggregate: grouping sorts every row (10^6 rows:
    0.5 s against 0.25 s for the distinct runs, which stop at the second, and the aggregate).

    Trackio indexes its metrics by run (``(run_id, step)``, ``(run_id, timestamp)``), and SQLite would
    read a run's rows through such an index, looking each row up and sorting them all again by rowid
    (10^6 rows: 2.4 s, or 1.6 s to group them, against 0.46 s and 0.45 s for a scan of the table in rowid
    order). Every query that reads a run's rows, or groups the runs, says ``NOT INDEXED``: one pass over the
    table, in the order the rows were logged."""
    if len(con.execute(f"SELECT DISTINCT {by} FROM metrics LIMIT 2").fetchall()) == 1:
        return con.execute(f"SELECT {by}, MIN(run_name), MIN(timestamp) FROM metrics").fetchall()
    return con.execute(f"SELECT {by}, MIN(run_name), MIN(timestamp) FROM metrics NOT INDEXED GROUP BY {by} "
                       "ORDER BY MIN(rowid)").fetchall()


def _typed_history(rows: Callable[[], Any], key: str | None, source: str,
                   query: tuple[str, str, str] | None = None) -> Any:
    """The history of a run's rows (``rows()``: a cursor of its (step, metrics JSON) rows), each row's
    ``step`` beside it as ``_step``, without a dict per row: the JSON read into columns by the compiled
    reader (:func:`~gradtool.io.logs.json_columns`), else decoded by msgspec straight into typed rows (see
    :func:`~gradtool.io.logs._msgspec_typed`; 10^6 rows ~2x faster than :func:`_decoded_at_once` and
    :func:`~gradtool.io.logs.from_records`). ``query`` (the database's URI, the query, the run): the
    compiled reader of rows (:func:`~gradtool.io.compiled.sqlite_rows`) runs it instead, when built, and
    gives the steps and the JSON joined by line breaks without a Python tuple per row (where a row is not
    an int step and JSON of one ASCII line, the cursor is read). Else the rows are taken ``FETCH_ROWS`` at a
    time, their JSON joined as they come (10^6 row tuples held at once cost ~250 MB). None (the dict path
    decides, with the same result) when neither the compiled readers nor msgspec are there or a row does
    not fit either: a key the first rows did not show, a string or NaN token for a number, a row of several
    lines, a ``_step`` key of its own."""
    from operator import itemgetter

    from .compiled import log_readers, sqlite_rows
    from .logs import _msgspec_typed, json_columns

    typed = importlib.util.find_spec("msgspec") is not None
    if not typed and log_readers() is None:
        return None
    compiled = sqlite_rows() if query is not None else None
    got = None if compiled is None else compiled(query[0], query[1], (query[2],), "ij")  # type: ignore[index]
    if got is not None:
        import numpy as np

        steps: Any = np.frombuffer(got[1][0], np.int64)
        joined = got[1][1]
    else:
        cursor = rows()
        steps, parts = [], []
        while chunk := cursor.fetchmany(FETCH_ROWS):
            steps.extend(map(itemgetter(0), chunk))
            part = _one_per_line(list(map(itemgetter(1), chunk)))
            if part is None:
                return None
            parts.append(part)
        joined = b"\n".join(parts)
        if not set(map(type, steps)) <= {int}:
            return None
    hist = json_columns(joined, source, key, "trackio", own_steps=steps)
    if hist is not None or not typed:
        return hist
    steps = steps if type(steps) is list else steps.tolist()
    return _msgspec_typed(joined, source, key, "trackio", own_steps=steps, nonfinite_words=True)


FETCH_ROWS = 1 << 16


def _one_per_line(blobs: list[Any]) -> bytes | None:
    """The rows' JSON (text or bytes) joined by line breaks; None when a row holds a line break (or a
    carriage return) of its own, or is neither text nor bytes."""
    try:
        joined = b"\n".join(blobs)  # rows of bytes: joined without a list of them made first
    except TypeError:  # text (older trackio), or a value that is neither (a number in a tampered row)
        try:
            joined = b"\n".join([b.encode("utf-8", "surrogatepass") if isinstance(b, str) else b
                                  for b in blobs])
        except (TypeError, UnicodeError):
            return None
    if joined.count(b"\n") != len(blobs) - 1 or b"\r" in joined:  # a row of several lines
        return None
    return joined


def _decoded_at_once(blobs: list[Any]) -> list[Any] | None:
    """Every row's JSON decoded by msgspec's ``decode_lines`` in one call (``gradtool[speedups]``; ~10x
    faster than a ``json.loads`` per row on 10^6 rows), each row on its own line and so decoded on its
    own. None (decode row by row) without msgspec, when a row holds a line break or is not strict JSON
    (a bare NaN from an old Trackio), or when the rows do not come back one value each."""
    try:
        import msgspec
    except ImportError:
        return None
    joined = _one_per_line(blobs)
    if joined is None:
        return None
    try:
        docs = msgspec.json.Decoder().decode_lines(joined)
    except msgspec.DecodeError:
        return None
    return docs if len(docs) == len(blobs) else None  # an empty row is skipped: row by row, then


def _record(rowid: Any, step: Any, metrics: Any, run: Run, source: str,
            decoded: bool = False) -> dict[str, Any]:
    """A row's metrics (JSON text or bytes; ``decoded``: the decoded value) as a dict, its own step under
    ``_step`` (unless it logged one of that name)."""
    doc = metrics if decoded else None
    if not decoded and isinstance(metrics, (str, bytes)):
        try:
            doc = json.loads(metrics)
        except (ValueError, RecursionError):
            doc = None
    if not isinstance(doc, dict):
        raise InputError(f"{source}: row {rowid} of Trackio run {run.label()} holds no JSON object of "
                         "metrics")
    if type(step) is int:
        doc.setdefault("_step", step)
    return doc


def _seconds(stamp: Any) -> float | None:
    """An ISO 8601 timestamp as seconds since the epoch (a naive one is local time, as Trackio wrote it)."""
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
