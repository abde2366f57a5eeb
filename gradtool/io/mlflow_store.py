"""MLflow tracking stores as gradient-norm histories.

Two layouts: the SQLite store (``mlflow.db``, MLflow's default since 3.7: tables ``runs`` and
``metrics(key, value, timestamp, step, is_nan, run_uuid)``) and the file store (``mlruns/<experiment>/
<run>/metrics/<name>``, the default before: one ``<ms timestamp> <value> [<step>]`` line per value). The
Hugging Face Trainer logs ``grad_norm``, ``loss`` and ``learning_rate`` there at ``state.global_step``
whenever mlflow is installed. Read with the standard library (sqlite3, read-only), never through mlflow.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from itertools import chain
from typing import Any

from ..errors import InputError, UsageError
from .runs import Run, choose_run_with_norm

DBL_MAX = 1.7976931348623157e308  # MLflow's SQL store writes +-Inf as +-DBL_MAX (SQL has no infinity)
_METRIC_LINE = re.compile(r"\d{12,14} \S+(?: -?\d+)?")  # "<ms timestamp> <value> [<step>]"
_META_FIELD = re.compile(r"^(\w+):\s*(.*?)\s*$", re.MULTILINE)

Series = tuple[Any, Any, Any]  # (steps, ms timestamps, values) as int64, int64, float64 arrays; the
# timestamps None when a store's rows were read without them (their steps are then distinct: no timestamp
# orders anything, see read_sqlite_tables)


def _logging_order(keys: Any, stamps: Any) -> Any:
    """The indices that sort ``keys`` (steps, or timestamps) and, within a key, by timestamp then row: the
    order of logging within each key, the later of a key's values last. ``stamps`` None: by row."""
    import numpy as np

    return np.argsort(keys, kind="stable") if stamps is None else np.lexsort((stamps, keys))


def is_metric_file_text(first: str) -> bool:
    """True when ``first``, the first line of a text that is not blank, is a line of MLflow's file store
    (``1700000000000 1.25 10``)."""
    return bool(_METRIC_LINE.fullmatch(first.rstrip("\r")))


def parse_metric_lines(text: str, source: str) -> Series:
    """The file store's ``<timestamp> <value> [<step>]`` lines as (steps, timestamps, values); a line
    without a step is step 0, as MLflow reads it. A malformed line is an InputError naming it."""
    raw = text.encode("utf-8", "replace")
    fast = _columns_compiled(raw)
    if fast is None:
        fast = _columns_msgspec(raw)
    return fast if fast is not None else parse_metric_lines_plain(text, source, raw)


def _columns_compiled(raw: bytes) -> Series | None:
    """The columns by the compiled log reader (``mlflow_metric_lines`` in gradtool/io/_logscan.c: every
    line ``<int> <number> <int>``, read as int() and float() read them, ~30 ns a line); None when it is
    not built (see :mod:`~gradtool.io.compiled`) or the file holds anything else."""
    from .compiled import log_readers

    if (readers := log_readers()) is None:
        return None
    import numpy as np

    got = readers.mlflow_metric_lines(raw)
    if got is None:
        return None
    steps, stamps, values = got
    return np.frombuffer(steps, np.int64), np.frombuffer(stamps, np.int64), np.frombuffer(values, np.float64)


def parse_metric_lines_plain(text: str, source: str, raw: bytes | None = None) -> Series:
    """:func:`parse_metric_lines` by the standard library and NumPy alone (without msgspec); ``raw``:
    ``text`` encoded as UTF-8, when the caller has it."""
    import numpy as np

    tokens = text.split()
    lines = _lines_of_two_spaces(text.encode("utf-8", "replace") if raw is None else raw)
    if lines is not None and len(tokens) == 3 * lines:  # what MLflow writes: convert the columns at once
        try:
            return (np.array(tokens[2::3], dtype=np.int64), np.array(tokens[0::3], dtype=np.int64),
                    np.array(tokens[1::3], dtype=np.float64))
        except (ValueError, OverflowError):
            pass  # find the bad line below
    steps, stamps, values = [], [], []
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            stamp, step = int(parts[0]), int(parts[2]) if len(parts) == 3 else 0
            if not (-1 << 63 <= stamp < 1 << 63 and -1 << 63 <= step < 1 << 63):  # no int64: a damaged file
                raise ValueError
            stamps.append(stamp)
            values.append(float(parts[1]))
            steps.append(step)
        except (ValueError, OverflowError):
            raise InputError(f"{source}: line {n} is not an MLflow metric line "
                             f"('<timestamp> <value> [<step>]'): {line[:60]!r}") from None
    return (np.array(steps, dtype=np.int64), np.array(stamps, dtype=np.int64),
            np.array(values, dtype=np.float64))


def _lines_of_two_spaces(raw: bytes) -> int | None:
    """The number of lines of ``raw`` (a last line without its line break counted) when each holds
    exactly two spaces, else None: counted with NumPy, so that with three fields in all per line, a line
    of two fields and one of four are not taken for two lines of three."""
    import numpy as np

    chars = np.frombuffer(raw, np.uint8)
    ends = np.flatnonzero(chars == ord("\n"))
    if chars.size and chars[-1] != ord("\n"):
        ends = np.append(ends, chars.size)
    spaces = np.flatnonzero(chars == ord(" "))
    if spaces.size != 2 * ends.size or not np.array_equal(np.searchsorted(spaces, ends),
                                                          2 * np.arange(1, ends.size + 1)):
        return None
    return int(ends.size)


_NONFINITE_VALUES = {"nan", "inf", "-inf"}  # Python's str() of them, as MLflow writes nonfinite values


def _columns_msgspec(raw: bytes) -> Series | None:
    """The columns of a file of ``<timestamp> <value> <step>`` lines (``raw``: its UTF-8 bytes), every
    field parsed by msgspec's C JSON number parser (``gradtool[speedups]``; ~2x faster than splitting the
    text and converting each column, 10^6 lines in ~0.3 s): with its spaces and line breaks turned into
    commas the text is one JSON array of 3 numbers a line (two spaces a line, counted first, and three
    numbers a line found, so each number is in its own line and column); ``nan``, ``inf`` and ``-inf``
    (no JSON) are quoted first and read as ``float`` reads them. Only when the timestamps and steps are
    JSON integers and the values JSON numbers or those words: their Python ``int``/``float`` are then the
    same. None (the caller's parse decides) without msgspec, and for anything else: other words, blank
    lines, a missing step, an integer ``-0`` value (msgspec gives +0.0, ``float`` -0.0), integers beyond
    int64."""
    try:
        import msgspec
    except ImportError:
        return None
    import numpy as np

    from .logs import _NEGATIVE_INTEGER_ZERO

    body = raw[:-1] if raw.endswith(b"\n") else raw
    lines = _lines_of_two_spaces(body) if body else None
    if lines is None or (b"-" in body and _NEGATIVE_INTEGER_ZERO.search(body)):
        return None
    array = b"[" + body.replace(b" ", b",").replace(b"\n", b",") + b"]"
    if b"n" in array:  # nan, inf, -inf: quoted (anything else that holds them is no JSON after)
        array = array.replace(b"-inf", b'"-inf"').replace(b",inf", b',"inf"').replace(b"nan", b'"nan"')
    try:
        numbers = msgspec.json.decode(array)
    except msgspec.DecodeError:
        return None
    if type(numbers) is not list or len(numbers) != 3 * lines:
        return None
    stamps, values, steps = numbers[0::3], numbers[1::3], numbers[2::3]
    kinds = set(map(type, values))
    if not (set(map(type, stamps)) == set(map(type, steps)) == {int} and kinds <= {int, float, str}):
        return None
    if str in kinds and not {v for v in values if type(v) is str} <= _NONFINITE_VALUES:
        return None
    try:
        return (np.array(steps, dtype=np.int64), np.array(stamps, dtype=np.int64),
                np.array(values, dtype=np.float64))
    except OverflowError:  # an integer beyond int64 (or a value beyond float64): the caller's parse says
        return None


def history_of_run(series: dict[str, Series], norm_key: str, loss_key: str | None, lr_key: str | None,
                   source: str, run: Run | None) -> Any:
    """A NormHistory from a run's metric series. A step logged more than once (a resumed run) keeps the
    value logged last. When every value has the same step (``mlflow.log_metric`` without ``step``), the
    steps are the order of logging and loss/learning rate are matched by timestamp instead (their series
    then need their timestamps; elsewhere a series of distinct steps may come without them)."""
    from .logs import NormHistory, last_per_key, values_at

    steps, stamps, values = series[norm_key]
    line_order = _logged_without_steps(steps)
    by = stamps if line_order else steps
    by, values = last_per_key(by, values, _logging_order(by, stamps))

    def matched(key: str | None) -> list[float | None] | None:
        """The metric ``key``'s value at each step of ``by`` (None where it has none): the later of a
        step's values."""
        if key is None or key not in series:
            return None
        s, t, v = series[key]
        k = t if line_order else s
        return values_at(*last_per_key(k, v, _logging_order(k, t)), by)

    hist = NormHistory(list(range(len(by))) if line_order else by.tolist(), values.tolist(),
                       matched(loss_key), matched(lr_key), source, norm_key, "mlflow")
    hist.run = run
    if line_order:
        hist.line_order = True
        hist.notes.append(f"{source}: the metric was logged without steps: steps are the order of logging "
                          "(0, 1, 2, ...), not training steps")
    return hist


def _choose(runs: list[Run], keys: dict[str, list[str]], key: str | None, run: str | None,
            source: str) -> Run:
    """The run to read (see :func:`~gradtool.io.runs.choose_run_with_norm`); ``keys``: each run's metric
    names, by its ``where``."""
    return choose_run_with_norm(runs, lambda r: keys.get(r.where, []), key, run, source, "MLflow",
                                "an MLflow store")


def _norm_key(keys: list[str], key: str | None, source: str, chosen: Run) -> str:
    from .logs import _find_norm_key, no_norm_metric

    nkey = _find_norm_key(keys, key)
    if nkey is None:
        raise no_norm_metric(f"{source}: run {chosen.label()} has", keys, key)
    return nkey


# ---- the SQLite store ------------------------------------------------------------------------------------

def read_sqlite_tables(con: Any, tables: set[str], key: str | None, run: str | None, source: str,
                       uri: str | None = None) -> Any:
    """The norm history of one run of the MLflow SQLite store ``con`` (opened by
    :func:`~gradtool.io.sqlite_logs.read_sqlite_log`; ``tables`` its tables): the only run with a gradient
    norm, or the one ``run`` names (see :func:`~gradtool.io.runs.choose_run`). Only the ``runs`` and
    ``metrics`` tables (and ``latest_metrics``, for the metric names) are read. ``uri``: the database's,
    for the compiled reader of rows (:func:`~gradtool.io.compiled.sqlite_rows`), which reads the metrics'
    rows when given and built (the same query, without a Python tuple per row: 0.45 -> 0.2 s per 10^6)."""
    import numpy as np

    from .compiled import sqlite_rows

    compiled = sqlite_rows() if uri is not None else None

    runs = [Run(str(rid), str(name or rid), start / 1000 if isinstance(start, (int, float)) else None,
                str(rid))
            for rid, name, start in con.execute(
                "SELECT run_uuid, name, start_time FROM runs WHERE lifecycle_stage IS NOT 'deleted'")]
    keys: dict[str, list[str]] = {}
    for table in ("latest_metrics", "metrics") if "latest_metrics" in tables else ("metrics",):
        for rid, k in con.execute(f"SELECT DISTINCT run_uuid, key FROM {table}"):
            keys.setdefault(str(rid), []).append(str(k))
        if keys:
            break
    chosen = _choose(runs, keys, key, run, source)

    def rows_of(k: str, columns: str, width: int) -> Any:
        """The metric's rows of ``columns``, streamed from the cursor into one float64 array of ``width``
        columns (the conversion ``np.array`` of the fetched rows makes, without 10^6 row tuples held)."""
        sql, params = f"SELECT {columns} FROM metrics WHERE run_uuid = ? AND key = ?", (chosen.where, k)
        if compiled is not None and (got := compiled(uri, sql, params, "f" * width)) is not None:
            cols = np.empty((got[0], width))  # the same numbers as below (the values np.fromiter reads)
            for j, col in enumerate(got[1]):
                cols[:, j] = np.frombuffer(col, np.float64)
        else:
            try:
                rows = con.execute(sql, params)
                cols = np.fromiter(chain.from_iterable(rows), np.float64).reshape(-1, width)
            except (ValueError, TypeError, OverflowError):
                cols = None
        if cols is None or not np.isfinite(cols[:, :width - 1]).all() or \
                (np.abs(cols[:, :width - 1]) >= 2.0 ** 63).any():
            raise InputError(f"{source}: metric {k!r} of run {chosen.label()} holds a value, step or "
                             "timestamp that is not a number")
        values = cols[:, -1].copy()
        values[np.abs(values) == DBL_MAX] *= np.inf  # +-DBL_MAX stood for +-Inf
        return cols, values

    def fetch(k: str, with_stamps: bool = False) -> Series:
        """The metric's (steps, timestamps, values). Without ``with_stamps`` the timestamps are read only
        when a step repeats (a resumed run): each column costs ~0.1 s per 10^6 rows, and distinct steps
        need no timestamp to order them. A NaN (``is_nan``) comes as the text 'nan', which ``fromiter``
        reads as NaN."""
        if not with_stamps:
            cols, values = rows_of(k, "step, CASE WHEN is_nan THEN 'nan' ELSE value END", 2)
            steps = cols[:, 0].astype(np.int64)
            if _distinct(steps):
                return steps, None, values
        cols, values = rows_of(k, "step, timestamp, CASE WHEN is_nan THEN 'nan' ELSE value END", 3)
        return cols[:, 0].astype(np.int64), cols[:, 1].astype(np.int64), values

    return _run_history(chosen, keys.get(chosen.where, []), key, source, fetch)


def _logged_without_steps(steps: Any) -> bool:
    """True when every value of a series has one step (more than one value): ``mlflow.log_metric`` was
    called without ``step``, and the order of logging stands for the steps."""
    return len(steps) > 1 and bool((steps == steps[0]).all())


def _distinct(steps: Any) -> bool:
    """True when no step of ``steps`` repeats (checked without a sort when they increase, as logged)."""
    import numpy as np

    return bool((np.diff(steps) > 0).all()) or bool((np.diff(np.sort(steps)) > 0).all())


def _run_history(chosen: Run, keys: list[str], key: str | None, source: str,
                 fetch: Callable[[str, bool], Series]) -> Any:
    """The history of run ``chosen`` whose metrics are ``keys``: its norm metric (``key``, or found), loss
    and learning rate, and per-parameter norms (Lightning's ``grad_2.0_norm/<name>`` through its
    MLFlowLogger), each read by ``fetch(metric, with_stamps)``: the timestamps may be left out (None) when
    the steps are distinct, unless ``with_stamps`` asks for them (a norm logged without steps matches the
    loss by timestamp)."""
    from .logs import _with_others, loss_and_lr_keys, tensor_norms_from

    nkey = _norm_key(keys, key, source, chosen)
    lkey, rkey = loss_and_lr_keys(keys)
    series = {nkey: fetch(nkey, False)}
    by_stamps = _logged_without_steps(series[nkey][0])  # the loss is then matched by timestamp
    series.update((k, fetch(k, by_stamps)) for k in (lkey, rkey) if k and k not in series)
    hist = _with_others(history_of_run(series, nkey, lkey, rkey, source, chosen), keys, key)

    def values_of(wanted: list[str]) -> dict[str, dict[int, float | None]]:
        out = {}
        for k in wanted:
            steps, stamps, values = fetch(k, False)
            o = _logging_order(steps, stamps)  # the later of a step's values wins
            out[k] = dict(zip(steps[o].tolist(), values[o].tolist()))
        return out

    return tensor_norms_from(hist, keys, values_of)


# ---- the file store --------------------------------------------------------------------------------------

def _is_run_dir(d: str) -> bool:
    return os.path.isfile(os.path.join(d, "meta.yaml")) and os.path.isdir(os.path.join(d, "metrics"))


def _run_dir_of(path: str) -> str | None:
    """The MLflow file-store run directory ``path`` is, or whose ``metrics`` it is; else None."""
    path = os.path.normpath(path)
    if _is_run_dir(path):
        return path
    parent = os.path.dirname(path)
    return parent if os.path.basename(path) == "metrics" and _is_run_dir(parent) else None


def is_run_directory(path: str) -> bool:
    """True when ``path`` is an MLflow file-store run (``meta.yaml`` and ``metrics/``) or its ``metrics``."""
    return _run_dir_of(path) is not None


def _file_run(d: str) -> Run | None:
    """The run in directory ``d`` from its ``meta.yaml`` (None when the run was deleted)."""
    try:
        with open(os.path.join(d, "meta.yaml"), encoding="utf-8", errors="replace") as f:
            meta = dict(_META_FIELD.findall(f.read(1 << 16)))
    except OSError:
        meta = {}
    meta = {k: v.strip("'\"") for k, v in meta.items()}
    if meta.get("lifecycle_stage") == "deleted":
        return None
    rid = meta.get("run_id") or meta.get("run_uuid") or os.path.basename(d)
    name = meta.get("run_name")
    if not name:
        try:
            with open(os.path.join(d, "tags", "mlflow.runName"), encoding="utf-8", errors="replace") as f:
                name = f.read(256).strip()
        except OSError:
            name = ""
    start = meta.get("start_time", "")
    return Run(rid, name or rid, int(start) / 1000 if start.isdigit() else None, d)


def file_store_runs(path: str, depth: int = 3) -> list[Run]:
    """The runs of an MLflow file store at ``path``: ``path`` itself when it is a run directory (or its
    ``metrics`` directory), else the run directories up to ``depth`` levels down (``[project/]mlruns/
    <experiment>/<run>``), deleted runs and hidden directories (``.trash``) left out."""
    path = _run_dir_of(path) or os.path.normpath(path)
    found: list[str] = []

    def visit(d: str, level: int) -> None:
        if _is_run_dir(d):
            found.append(d)
            return
        if level < depth:
            try:
                names = sorted(os.listdir(d))
            except OSError:
                return
            for n in names:
                if not n.startswith(".") and os.path.isdir(os.path.join(d, n)):
                    visit(os.path.join(d, n), level + 1)

    visit(path, 0)
    return [r for r in map(_file_run, found) if r is not None]


def metric_files(run_dir: str) -> dict[str, str]:
    """A file-store run's metrics: name (``train/grad_norm`` for a nested file) -> file."""
    from .logs import files_by_metric

    return files_by_metric(os.path.join(run_dir, "metrics"))


def read_file_store(path: str, key: str | None = None, run: str | None = None,
                    runs: list[Run] | None = None) -> Any:
    """The norm history of one run of the MLflow file store at ``path`` (a run directory, an experiment,
    ``mlruns``): the only run with a gradient norm, or the one ``run`` names."""
    runs = file_store_runs(path) if runs is None else runs
    files = {r.where: metric_files(r.where) for r in runs}
    chosen = _choose(runs, {w: list(f) for w, f in files.items()}, key, run, path)
    return _read_file_run(chosen, files[chosen.where], key, path)


def _read_file_run(chosen: Run, files: dict[str, str], key: str | None, source: str) -> Any:
    from .logs import _read_text

    return _run_history(chosen, list(files), key, source,
                        lambda k, with_stamps: parse_metric_lines(_read_text(files[k]), files[k]))


def read_metric_file(path: str, text: str, key: str | None = None, source: str | None = None) -> Any:
    """One file of a file store's ``metrics/`` directory given by itself. Inside its run directory the
    run's loss and learning rate are read beside it; a copy elsewhere (or standard input) is the norm alone.
    A file whose name is not a gradient norm's (``metrics/loss``) is refused unless ``key`` names it."""
    from .logs import NORM_KEYS, _looks_like_norm_key

    source = source or path
    run_dir, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    while run_dir != os.path.dirname(run_dir) and os.path.basename(run_dir) != "metrics":
        name = f"{os.path.basename(run_dir)}/{name}"  # a nested metric: metrics/train/grad_norm
        run_dir = os.path.dirname(run_dir)
    run_dir = os.path.dirname(run_dir)
    chosen = _file_run(run_dir) if source == path and _is_run_dir(run_dir) else None
    if chosen is None:
        name = os.path.basename(path)
    if source == path:
        if key is not None and key != name:
            raise UsageError(f"{source}: holds the metric {name!r}, not --key {key!r}")
        if key is None and not (name.lower() in NORM_KEYS or _looks_like_norm_key(name)):
            raise InputError(f"{source}: is the MLflow metric {name!r}, not a gradient norm; give the run's "
                             f"norm metric file (or --key {name} to use this one)")
    if chosen is None:  # a copy of the file, or standard input: the norm alone
        name = key or (name if source == path else "value")
        return history_of_run({name: parse_metric_lines(text, source)}, name, None, None, source, None)
    return _read_file_run(chosen, metric_files(run_dir), name, source)
