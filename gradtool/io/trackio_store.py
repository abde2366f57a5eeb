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

import json
from datetime import datetime
from typing import Any

from ..errors import InputError, listed
from .runs import Run, choose_run

TRACKIO_COLUMNS = {"run_name", "step", "metrics"}


def is_trackio_project(con: Any, tables: set[str]) -> bool:
    """True when the database ``con`` (whose tables are ``tables``) has Trackio's ``metrics`` table."""
    if "metrics" not in tables:
        return False
    return TRACKIO_COLUMNS <= {str(row[1]) for row in con.execute("PRAGMA table_info(metrics)")}


def read_trackio_project(con: Any, key: str | None, run: str | None, source: str) -> Any:
    """The norm history of one run of the Trackio project ``con``: the only run that logged a gradient
    norm, or the one ``run`` names (see :func:`~gradtool.io.runs.choose_run`). A row's own step comes
    last (as ``_step``, W&B's name for such a counter): ``train/global_step``, logged by the Hugging Face
    Trainer in every row, is the training step."""
    from .logs import NORM_KEYS, _find_norm_key, from_records

    columns = {str(row[1]) for row in con.execute("PRAGMA table_info(metrics)")}
    run_column = "run_id" if "run_id" in columns else "run_name"
    rows_of: dict[str, list[tuple[Any, Any, Any]]] = {}
    names: dict[str, str] = {}
    firsts: dict[str, Any] = {}
    for rowid, rid, name, step, stamp, metrics in con.execute(
            f"SELECT rowid, {run_column}, run_name, step, timestamp, metrics FROM metrics ORDER BY rowid"):
        rid = str(rid)
        rows_of.setdefault(rid, []).append((rowid, step, metrics))
        names.setdefault(rid, str(name))
        firsts.setdefault(rid, stamp)
    runs = [Run(rid, names[rid], _seconds(firsts[rid]), rid) for rid in rows_of]
    if not runs:
        raise InputError(f"{source}: a Trackio project with no runs")
    records_of: dict[str, list[dict[str, Any]]] = {}
    keys_of: dict[str, list[str]] = {}
    for r in runs:
        records_of[r.id] = [_record(rowid, step, metrics, r, source)
                            for rowid, step, metrics in rows_of[r.id]]
        keys_of[r.id] = list(dict.fromkeys(k for rec in records_of[r.id] for k in rec))
    by_name = run not in (None, "latest")
    candidates = runs if by_name else [r for r in runs if _find_norm_key(keys_of[r.id], key)]
    if not candidates:
        seen = sorted({k for r in runs for k in keys_of[r.id]} - {"_step"})
        tried = ", ".join(NORM_KEYS[:4])
        named = f"no metric {key!r}" if key else f"no gradient-norm metric (tried {tried}, ...)"
        raise InputError(f"{source}: {named} in its {len(runs)} Trackio run(s) (metrics: {listed(seen, 12)})"
                         + ("" if key else "; name it with --key"))
    what = "Trackio runs" if by_name else "Trackio runs with a gradient norm"
    chosen = choose_run(candidates, run, source, what)
    try:
        hist = from_records(records_of[chosen.id], source, "trackio", key)
    except InputError as exc:
        raise InputError(f"{source}: run {chosen.label()}: {str(exc).removeprefix(source + ': ')}") from None
    hist.run = chosen
    return hist


def _record(rowid: Any, step: Any, metrics: Any, run: Run, source: str) -> dict[str, Any]:
    """A row's metrics as a dict, its own step under ``_step``."""
    try:
        doc = json.loads(metrics) if isinstance(metrics, (str, bytes)) else None
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        raise InputError(f"{source}: row {rowid} of Trackio run {run.label()} holds no JSON object of "
                         "metrics")
    return {"_step": step, **doc} if type(step) is int else doc


def _seconds(stamp: Any) -> float | None:
    """An ISO 8601 timestamp as seconds since the epoch (a naive one is local time, as Trackio wrote it)."""
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
