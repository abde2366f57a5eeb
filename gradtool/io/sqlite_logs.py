"""Training logs kept in SQLite: MLflow's ``mlflow.db`` (:mod:`~gradtool.io.mlflow_store`) and a Trackio
project's ``<project>.db`` (:mod:`~gradtool.io.trackio_store`), told apart by their tables.

The file is opened read-only with the standard library's sqlite3 and its schema is not trusted: queries
stay off (``query_only``), functions in the schema do not run (``trusted_schema = OFF``), only tables
(never views or triggers) of known names are read, and text that does not decode is replaced.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import InputError

KINDS = {"mlflow": "MLflow database", "trackio": "Trackio project"}


def read_sqlite_log(path: str, key: str | None = None, run: str | None = None,
                    source: str | None = None) -> Any:
    """The norm history of one run of the MLflow store or Trackio project at ``path`` (``run`` chooses
    among several; see :func:`~gradtool.io.runs.choose_run`)."""
    from . import mlflow_store, trackio_store

    source = source or path
    with _opened(path, source) as (con, tables, kind):
        if kind == "mlflow":
            return mlflow_store.read_sqlite_tables(con, tables, key, run, source, _uri(path))
        if kind == "trackio":
            return trackio_store.read_trackio_project(con, key, run, source, _uri(path))
        raise InputError(f"{source}: an SQLite database, but not an MLflow tracking store (no metrics "
                         "and runs tables) nor a Trackio project (no metrics table of run_name, step, "
                         "metrics)")


def log_databases(directory: str) -> list[str]:
    """The MLflow and Trackio databases directly in ``directory``, in name order: files named ``*.db``
    (MLflow's default ``mlflow.db`` in the directory it ran in, Trackio's ``<project>.db`` in
    ``~/.cache/huggingface/trackio/``) whose tables are one of theirs. Other SQLite files (an Optuna
    study's) and files that cannot be read are not."""
    from .detect import SQLITE_MAGIC, head_of

    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(directory, name)
        if not name.endswith(".db") or not os.path.isfile(path):
            continue
        try:
            if not head_of(path).startswith(SQLITE_MAGIC):
                continue
            with _opened(path, path) as (_, _, kind):
                if kind is not None:
                    found.append(path)
        except (InputError, OSError):
            continue
    return found


@contextmanager
def _opened(path: str, source: str) -> Iterator[tuple[Any, set[str], str | None]]:
    """The database at ``path`` opened read-only, its tables, and which store it is ("mlflow",
    "trackio" or None). An SQLite error, then or while the caller reads it, is an InputError."""
    import sqlite3
    from contextlib import closing

    from .trackio_store import is_trackio_project

    try:
        con = sqlite3.connect(_uri(path), uri=True)
    except sqlite3.Error as exc:
        raise InputError(f"{source}: cannot open the SQLite database ({exc})") from None
    kind = None
    try:
        with closing(con):
            con.text_factory = lambda b: b.decode("utf-8", "replace")  # a damaged name: no UnicodeDecodeError
            con.execute("PRAGMA query_only = ON")
            con.execute("PRAGMA trusted_schema = OFF")
            tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            kind = ("mlflow" if {"metrics", "runs"} <= tables
                    else "trackio" if is_trackio_project(con, tables) else None)
            yield con, tables, kind
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # a damaged schema's error message may not decode
        why = " ".join(str(exc).split())  # SQLite quotes the schema, line breaks and all
        raise InputError(f"{source}: cannot read the {KINDS.get(kind or '', 'database')} "
                         f"({why if len(why) < 200 else why[:197] + '...'})") from None


def _uri(path: str) -> str:
    """The URI that opens the database at ``path`` read-only (for sqlite3.connect, and the compiled reader's
    own connection: :func:`~gradtool.io.compiled.sqlite_rows`)."""
    from urllib.parse import quote

    return f"file:{quote(os.path.abspath(path))}?mode=ro"
