"""DVCLive logs as gradient-norm histories.

DVCLive (``report_to="dvclive"`` in the Hugging Face Trainer; its Lightning, Keras and fastai loggers)
writes each metric to its own tab-separated file, ``<dir>/plots/metrics/<name>.tsv`` (``<dir>`` is
``dvclive/`` by default; a name with ``/`` is a subdirectory), of lines ``step value`` under the header
``step <last part of the name>`` (a ``timestamp`` column first when asked for, and always in older
versions). ``step`` is DVCLive's own counter, which its Trainer callback advances once per log call
(every ``logging_steps``) and its Lightning logger sets to the trainer's global step. The files of the
norm, loss and learning rate are read and joined by that step.
"""

from __future__ import annotations

import csv
import os
from typing import Any

from ..errors import InputError

METRICS_DIR = os.path.join("plots", "metrics")


def dvclive_files(path: str) -> dict[str, str]:
    """Metric name -> file of the DVCLive log at ``path`` (the log's directory, its ``plots/metrics``
    directory, or a directory holding ``dvclive/``), in name order; empty when ``path`` holds none."""
    from .logs import files_by_metric

    for d in (os.path.join(path, METRICS_DIR), os.path.join(path, "dvclive", METRICS_DIR), path):
        if os.path.isdir(d) and os.path.normpath(d).endswith(METRICS_DIR) and (
                files := files_by_metric(d, (".tsv", ".csv"))):
            return dict(sorted(files.items()))
    return {}


def _series(path: str) -> dict[int, float | None]:
    """Step -> value of one metric file; a line cut short (the last one of a run that crashed) or one
    that is not ``[timestamp] step value`` is skipped, as a JSON Lines log's garbage lines are."""
    from .logs import _num, _read_text

    rows = csv.reader(_read_text(path).splitlines(), delimiter="\t" if path.endswith(".tsv") else ",")
    header = [h.strip() for h in next(rows, [])]
    at = 1 if header[:1] == ["timestamp"] else 0  # the step's column
    if header[at:at + 1] != ["step"] or len(header) != at + 2:
        raise InputError(f"{path}: not a DVCLive metric file (its header is not '[timestamp] step <name>')")
    values: dict[int, float | None] = {}
    for row in rows:
        if len(row) == at + 2 and row[at].strip().isdigit():
            values[int(row[at])] = _num(row[at + 1])  # a step logged twice (a resumed run): the later value
    return values


def read_dvclive(path: str, key: str | None = None, files: dict[str, str] | None = None) -> Any:
    """The norm history of the DVCLive log at ``path`` (see the module's docstring; ``files``: its
    :func:`dvclive_files`, when the caller has them). When the log is the Hugging Face Trainer's
    (``grad_norm`` beside ``learning_rate`` and ``epoch``), its steps count log calls, not training
    steps: the history says so."""
    from .logs import _find_norm_key, from_metric_series, no_norm_metric

    files = files or dvclive_files(path)
    if not files:
        raise InputError(f"{path}: no DVCLive metric files (plots/metrics/*.tsv)")
    nkey = _find_norm_key(files, key)
    if nkey is None:
        raise no_norm_metric(f"{path}: DVCLive log with", files, key)
    hist = from_metric_series(files, nkey, lambda name: _series(files[name]).items(), path, "dvclive")
    if nkey == "grad_norm" and {"learning_rate", "epoch"} <= files.keys():  # the Trainer's callback
        hist.line_order = True
        hist.notes.append(f"{path}: DVCLive's steps count the Hugging Face Trainer's log calls (one every "
                          "logging_steps), not training steps")
    return hist
