"""The optional compiled log readers (gradtool/io/_logscan.c): W&B history records, TensorBoard's TFRecord
framing, CRCs and scalar events (add_scalar's, tf.summary.scalar's), MLflow metric lines, text log lines
by a line template, console lines that end in a dict (the Hugging Face Trainer's) by a template, the
rows of MLflow's and Trackio's SQLite databases as columns, JSON Lines (and a trainer_state.json's
log_history array) of flat objects of numbers, CSV logs without quotes. Each reader that uses them keeps
its Python (and NumPy, msgspec) path, which gives the same results and runs when the extension was not
built (no C compiler at install time) or ``GRADTOOL_NO_KERNELS`` is set."""

from __future__ import annotations

from functools import cache
from typing import Any

from ..kernel_switch import kernels_turned_off


def log_readers() -> Any:
    """The ``gradtool.io._logscan`` module, or None (not built, or turned off by ``GRADTOOL_NO_KERNELS``).
    Looked up at each call, so that tests can switch it off."""
    if kernels_turned_off():
        return None
    try:
        from . import _logscan
    except ImportError:
        return None
    return _logscan


def member_inflater() -> Any:
    """``inflate_raw(packed, table, out) -> bytes`` of ``gradtool.io._inflate_many`` (many raw-deflate
    members inflated in one call without the GIL; see its source), or None (not built: no C compiler or
    no zlib header at install time; or turned off by ``GRADTOOL_NO_KERNELS``)."""
    if kernels_turned_off():
        return None
    try:
        from . import _inflate_many
    except ImportError:
        return None
    return _inflate_many.inflate_raw


# SQLite's functions sqlite_rows calls, in the order of sqlite_api_t in _logscan.c
_SQLITE_FUNCTIONS = ("open_v2", "close", "exec", "prepare_v2", "bind_text", "step", "column_count",
                     "column_type", "column_double", "column_int64", "column_blob", "column_text",
                     "column_bytes", "finalize")


def sqlite_rows() -> Any:
    """``sqlite_rows(uri, sql, params, kinds) -> (rows, columns) | None`` (see _logscan.c): a read-only
    query's rows as columns, run by the SQLite library the sqlite3 module uses (its functions found with
    ctypes in the ``_sqlite3`` module's library), without a Python tuple per row; or None when the
    compiled readers are off or that library's functions cannot be found (a Python built with SQLite
    linked in and its symbols hidden)."""
    readers = log_readers()
    api = _sqlite_api() if readers is not None else None
    if api is None:
        return None
    return lambda uri, sql, params, kinds: readers.sqlite_rows(api, uri, sql, tuple(params), kinds)


@cache
def _sqlite_api() -> tuple[int, ...] | None:
    """The addresses of SQLite's functions (:data:`_SQLITE_FUNCTIONS`) in the library of the sqlite3
    module, or None."""
    try:
        import ctypes

        import _sqlite3

        lib = ctypes.CDLL(_sqlite3.__file__)
        addresses = tuple(ctypes.cast(getattr(lib, f"sqlite3_{name}"), ctypes.c_void_p).value
                          for name in _SQLITE_FUNCTIONS)
    except (ImportError, OSError, AttributeError):
        return None
    return None if None in addresses else addresses  # type: ignore[return-value]
