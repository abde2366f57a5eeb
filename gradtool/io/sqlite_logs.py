"""Training logs kept in SQLite: MLflow's ``mlflow.db`` (:mod:`~gradtool.io.mlflow_store`) and a Trackio
project's ``<project>.db`` (:mod:`~gradtool.io.trackio_store`), told apart by their tables.

The file is opened read-only with the standard library's sqlite3 and its schema is not trusted: queries
stay off (``query_only``), functions in the schema do not run (``trusted_schema = OFF``), only tables
(never views or triggers) of known names are read, and text that does not decode is replaced.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import InputError


def read_sqlite_log(path: str, key: str | None = None, run: str | None = None,
                    source: str | None = None) -> Any:
    """The norm history of one run of the MLflow store or Trackio project at ``path`` (``run`` chooses
    among several; see :func:`~gradtool.io.runs.choose_run`)."""
    import sqlite3
    from contextlib import closing
    from urllib.parse import quote

    from . import mlflow_store, trackio_store

    source = source or path
    try:
        con = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise InputError(f"{source}: cannot open the SQLite database ({exc})") from None
    what = "database"
    try:
        with closing(con):
            con.text_factory = lambda b: b.decode("utf-8", "replace")  # a damaged name: no UnicodeDecodeError
            con.execute("PRAGMA query_only = ON")
            con.execute("PRAGMA trusted_schema = OFF")
            tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if {"metrics", "runs"} <= tables:
                what = "MLflow database"
                return mlflow_store.read_sqlite_tables(con, tables, key, run, source)
            if trackio_store.is_trackio_project(con, tables):
                what = "Trackio project"
                return trackio_store.read_trackio_project(con, key, run, source)
            raise InputError(f"{source}: an SQLite database, but not an MLflow tracking store (no metrics "
                             "and runs tables) nor a Trackio project (no metrics table of run_name, step, "
                             "metrics)")
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # a damaged schema's error message may not decode
        why = " ".join(str(exc).split())  # SQLite quotes the schema, line breaks and all
        raise InputError(f"{source}: cannot read the {what} ({why if len(why) < 200 else why[:197] + '...'})"
                         ) from None
