"""Training logs that carry a gradient-norm history (and often loss and learning rate).

Read: Hugging Face ``trainer_state.json`` (its ``log_history``; a run directory of
``checkpoint-*/trainer_state.json`` is merged by step), CSV/TSV with a header (Lightning ``metrics.csv``,
W&B exports), JSON Lines, Megatron/fairseq-style text logs (``grad norm: 1.234``), console lines that end
in a dict of metrics (the Hugging Face Trainer's, fairseq's JSON log format), and TensorBoard event
files (:mod:`~gradtool.io.tensorboard_log`), MLflow's stores (:mod:`~gradtool.io.mlflow_store`), W&B run logs
(:mod:`~gradtool.io.wandb_log`); gzip, bzip2 or xz-compressed, with or without a byte-order mark. The
non-standard tokens ``NaN``/``Infinity`` are accepted. The norm key is found automatically (see
``NORM_KEYS``) or named with ``key``.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import math
import operator
import os
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain, islice, repeat
from typing import Any, Literal, NoReturn

from ..errors import InputError, UsageError, listed

NORM_KEYS = ("grad_norm", "gnorm", "grad_2.0_norm_total", "grad-norm", "total_norm", "grad_norm_total",
             "train/grad_norm", "gradient_norm", "global_grad_norm", "grad norm", "grad_norm/total",
             "grads/norm", "l2_norm/grad/global", "grad_l2_norm/step",  # Composer's Optimizer/GradMonitor
             "l2_grads", "grad/norm",  # big_vision, musubi-tuner
             "grad/total/2.0_norm")  # Lightning's grad_2.0_norm_total as older DVCLive loggers name it
# Lightning's names of a norm logged with on_step=True and on_epoch=True (see _find_norm_key)
_NORM_KEYS_STEP = tuple(f"{k}_step" for k in NORM_KEYS)
# The trainer's step before W&B's `_step`, which counts log calls (a W&B history saved to a file has both)
STEP_KEYS = ("step", "global_step", "train/global_step", "trainer/global_step", "iteration", "iter",
             "num_updates", "steps", "_step")
LOSS_KEYS = ("loss", "train_loss", "train/loss", "lm loss", "lm_loss", "training_loss", "train_loss_step",
             "train/ce loss", "train/crossentropyloss",  # OLMo-core, OLMo
             "loss/train/total")  # Composer
LR_KEYS = ("learning_rate", "lr", "train/learning_rate", "learning rate", "lr-adam", "lr-adamw", "lr-sgd",
           "optim/lr (group 0)", "optim/learning_rate_group0",  # OLMo-core, OLMo
           "learning-rate", "learning/current_learning_rate",  # Megatron's TensorBoard tag, MaxText
           "lr-decoupledadamw/group0", "lr-adamw/group0")  # Composer's LRMonitor
MAX_LOG_BYTES = 2 << 30


def _column_list(index: int, attribute: str) -> Any:
    """A ``NormHistory`` column as a list, made from ``arrays()[index]`` on first use and kept in
    ``attribute`` (loss and learning rate are masked arrays: ``tolist`` gives None where masked)."""

    def get(self: NormHistory) -> list[Any]:
        values = getattr(self, attribute)
        if values is None:
            values = self.arrays()[index].tolist()
            setattr(self, attribute, values)
        return values

    return property(get)


def _per_tensor_lists(attribute: str) -> Any:
    """A ``NormHistory``'s per-parameter columns (the float64 arrays in ``attribute``) as lists: made from
    the arrays when first asked for and kept while the arrays are the same ones. Setting it sets the
    arrays."""
    cache = f"_{attribute}_as_lists"

    def get(self: NormHistory) -> dict[str, list[float]]:
        arrays = getattr(self, attribute)
        made = getattr(self, cache, None)  # (the arrays the lists were made from, the lists)
        if (made is None or list(made[0]) != list(arrays)
                or any(made[0][name] is not a for name, a in arrays.items())):
            made = dict(arrays), {name: a.tolist() for name, a in arrays.items()}
            setattr(self, cache, made)
        return made[1]

    def set(self: NormHistory, columns: dict[str, Any]) -> None:
        import numpy as np

        setattr(self, attribute, {name: np.asarray(v, dtype=np.float64) for name, v in columns.items()})

    return property(get, set)


class NormHistory:
    """A gradient-norm history: one entry per logged step, sorted by step, without duplicates.

    The columns are lists (``steps``, ``norms``, ``loss`` and ``lr``; None where a value was not logged)
    and arrays (:meth:`arrays`). A reader that parsed a log with NumPy may give only the arrays (the lists
    are then left as None): the lists are made from them on first use, so an analysis that needs only
    the arrays (``suggest-threshold --format json`` on a 10^6-row CSV) never builds 4 x 10^6 Python objects.
    """

    def __init__(self, steps: list[int] | None, norms: list[float] | None, loss: list[float | None] | None = None,
                 lr: list[float | None] | None = None, source: str = "", key: str = "", kind: str = "",
                 _arrays: tuple | None = None):
        if (steps is None or norms is None) and _arrays is None:
            raise TypeError("NormHistory needs its steps and norms, as lists or as arrays")
        self._steps, self._norms = steps, norms
        if steps is not None:  # no (or empty) loss / learning rate: not logged, None at every step
            self._loss, self._lr = loss or [None] * len(steps), lr or [None] * len(steps)
        else:  # made from the arrays on first use
            self._loss, self._lr = loss or None, lr or None
        self.source, self.key, self.kind = source, key, kind  # kind: trainer_state, csv, jsonl, text, ...
        self.other_keys: list[str] = []  # other columns that hold a norm too (see other_norm_keys)
        self.notes: list[str] = []  # what a reader of the recommendation should know about this log
        self.line_order = False  # steps are the order of the log's lines (it gives no step numbers)
        self.run: Any = None  # the runs.Run read from a store of runs (MLflow, W&B, TensorBoard, an export)
        # per-parameter norms logged beside the global one (tensor_norms_from): tensor name -> float64 array
        # of a value at each of ``steps``; L2 norms, and max |g| (the inf-norm). As lists: tensor_norms,
        # tensor_max_abs (made on first use: 500 parameters x 20,000 steps are 10^7 Python floats)
        self.tensor_norm_arrays: dict[str, Any] = {}
        self.tensor_max_abs_arrays: dict[str, Any] = {}
        self._arrays = _arrays

    steps = _column_list(0, "_steps")  # list[int]
    norms = _column_list(1, "_norms")  # list[float]
    loss = _column_list(2, "_loss")  # list[float | None]
    lr = _column_list(3, "_lr")  # list[float | None]
    tensor_norms = _per_tensor_lists("tensor_norm_arrays")  # dict[str, list[float]]
    tensor_max_abs = _per_tensor_lists("tensor_max_abs_arrays")  # dict[str, list[float]]

    def __len__(self) -> int:
        return len(self._steps) if self._steps is not None else int(self.arrays()[0].shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NormHistory):
            return NotImplemented
        return ((self.steps, self.norms, self.loss, self.lr, self.source, self.key, self.kind)
                == (other.steps, other.norms, other.loss, other.lr, other.source, other.key, other.kind))

    def __repr__(self) -> str:
        return f"NormHistory({len(self)} steps, source={self.source!r}, key={self.key!r}, kind={self.kind!r})"

    def arrays(self) -> tuple[Any, Any, Any, Any]:
        """(steps, norms, loss, lr) as arrays: int64 steps, float64 norms, loss and learning rate as float64
        masked where not logged, which the analysis takes without converting again. A reader that parsed
        the columns with NumPy hands its arrays over; otherwise they are built here, once."""
        if self._arrays is None:
            import numpy as np

            from ..suggest import masked_column, step_array

            n = len(self.steps)
            self._arrays = (step_array(self.steps), np.asarray(self.norms, dtype=np.float64),
                            masked_column(self.loss, n), masked_column(self.lr, n))
        return self._arrays

    def _logged(self, i: int, values: list[float | None] | None) -> bool:
        if values is None:  # not made yet: the array's mask says it without building the list
            import numpy as np

            return not bool(np.ma.getmaskarray(self.arrays()[i]).all())
        return values.count(None) != len(values)  # list.count: no Python per step

    @property
    def has_loss(self) -> bool:
        return self._logged(2, self._loss)

    @property
    def has_lr(self) -> bool:
        return self._logged(3, self._lr)


def _num(v: Any) -> float | None:
    """A logged value as a float: a number (not a bool), or a string of one as ``float`` reads it (spaces
    around, nan, inf, infinity in any case, a sign on each; NaN always positive); else None."""
    t = type(v)
    if t is float:
        return v
    if t is int:
        return float(v)
    if isinstance(v, str):  # (``float`` itself: the words and spaces were spelled out here one by one, and
        try:  # 1.5M cells took 1.6 s; 0.6 s now)
            x = float(v)
        except ValueError:
            return None
        return math.nan if x != x else x
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    return None


def _find_key(keys: Iterable[str], wanted: Sequence[str], explicit: str | None = None) -> str | None:
    keys = list(keys)
    if explicit:
        return explicit if explicit in keys else None
    lower = {k.lower(): k for k in keys}
    for w in wanted:
        if w in lower:
            return lower[w]
    return None


def _clip_words(name: str) -> str:
    """"before" for a gradient-norm name that says it is taken before clipping ("raw_grad_norm",
    "grad_norm_before_clip", "unclipped grad norm", "grad_norm/pre_clip"), "after" for one that names
    clipping otherwise ("grad_norm_clipped", "clipped grad norm"), "" for neither."""
    words = re.split(r"[^a-z0-9]+", name.lower())
    if "raw" in words or "unclipped" in words or "preclip" in words or any(
            w in ("pre", "before") and nxt.startswith("clip") for w, nxt in zip(words, words[1:])):
        return "before"
    return "after" if "clip" in name.lower() else ""


def _find_loss_key(keys: Iterable[str]) -> str | None:
    """The first of LOSS_KEYS, else the first training key whose last part is "loss" ("learning/loss",
    MaxText's; not "eval/loss")."""
    keys = list(keys)
    return _find_key(keys, LOSS_KEYS) or next(
        (k for k in keys if k.lower().rsplit("/", 1)[-1] == "loss"
         and not k.lower().startswith(("eval", "val", "test"))), None)


def loss_and_lr_keys(keys: Iterable[str]) -> tuple[str | None, str | None]:
    """The loss key (:func:`_find_loss_key`) and the learning-rate key (the first of LR_KEYS) among
    ``keys``, each None when there is none."""
    keys = list(keys)
    return _find_loss_key(keys), _find_key(keys, LR_KEYS)


def _looks_like_norm_key(key: str) -> bool:
    """e.g. "train/grad_norm_global", "run-a - train/grad_norm", "optim/total grad norm" (OLMo-core),
    "learning/raw_grad_norm" (MaxText, before clipping); not "grad_norm_clipped" nor a per-layer
    "grad_norm/layer.0"."""
    low = key.lower()
    return (any(n in low for n in ("grad_norm", "gnorm", "grad-norm", "grad norm"))
            and _clip_words(low) != "after"
            and "/" not in re.sub(r"/(?:pre|before)[_-]?clip\w*$", "", low)[:-1].split("grad")[-1])


def _find_norm_key(keys: Iterable[str], explicit: str | None) -> str | None:
    """``explicit`` if it is one of ``keys``; else the first gradient-norm key named as taken before
    clipping (MaxText logs learning/grad_norm after clipping, never above the threshold, and
    learning/raw_grad_norm before it), else the first of NORM_KEYS, else one of them with Lightning's
    ``_step`` suffix (``self.log(..., on_step=True, on_epoch=True)`` logs ``NAME_step`` at each step and
    ``NAME_epoch``, a mean, at each epoch's end), else the first that looks like one."""
    keys = list(keys)
    if not explicit:
        before = next((c for c in keys if _looks_like_norm_key(c) and _clip_words(c) == "before"), None)
        if before is not None:
            return before
    k = _find_key(keys, NORM_KEYS, explicit) or (None if explicit else _find_key(keys, _NORM_KEYS_STEP))
    if k or explicit:
        return k
    return next((c for c in keys if _looks_like_norm_key(c)), None)


def _epoch_twin(key: str) -> str | None:
    """``NAME_epoch`` for Lightning's ``NAME_step`` (the same metric's epoch mean), else None."""
    return key[:-len("_step")] + "_epoch" if key.endswith("_step") else None


def why_no_norm(keys: Iterable[str]) -> str:
    """The likely reason a log of these metric names holds no gradient norm, as "; ..." for an error
    message, or "" (the Hugging Face Trainer logs ``grad_norm`` from transformers 4.38 on, and only when
    it clips: ``max_grad_norm`` > 0)."""
    low = {k.lower() for k in keys if isinstance(k, str)}
    if {"current_steps", "total_steps"} <= low:
        return "; LLaMA-Factory's trainer_log.jsonl leaves it out: read trainer_state.json beside it"
    if low & {"loss", "train/loss"} and low & {"learning_rate", "train/learning_rate"}:
        return ("; the Hugging Face Trainer logs grad_norm from transformers 4.38 on, and only with "
                "max_grad_norm > 0")
    return ""


def no_norm_metric(where: str, keys: Iterable[str], key: str | None) -> InputError | UsageError:
    """The error for a run or log (``where``: "SOURCE: run 'x' has") whose metrics ``keys`` hold no
    gradient norm, or not the metric ``key`` named (a usage error): it lists them and says why when it
    can (:func:`why_no_norm`)."""
    keys = sorted(keys)
    if key:
        return UsageError(f"{where} no metric {key!r} (metrics: {listed(keys, 12)})")
    return InputError(f"{where} no gradient-norm metric (metrics: {listed(keys, 12)}); name it with --key"
                      + why_no_norm(keys))


def other_norm_keys(keys: Iterable[str], chosen: str) -> list[str]:
    """The keys besides ``chosen`` that hold a gradient norm too: a W&B export of several runs has one
    column per run ("run-a - train/grad_norm", "run-b - train/grad_norm"; its ``__MIN``/``__MAX``
    columns are the same run's), and the first is taken unless ``--key`` says otherwise. Beside a norm
    taken before clipping, the others are the same run's after it (see :func:`_with_others`)."""
    return [] if _clip_words(chosen) == "before" else _norm_keys_besides(keys, chosen)


def _norm_keys_besides(keys: Iterable[str], chosen: str) -> list[str]:
    """The keys other than ``chosen`` that name a gradient norm (a W&B export's ``__MIN``/``__MAX``
    columns left out)."""
    return [k for k in keys if k != chosen and not k.endswith(("__MIN", "__MAX")) and k != _epoch_twin(chosen)
            and (k.lower() in NORM_KEYS or _looks_like_norm_key(k))]


COLUMNS_FROM_ROWS = 64  # from_records reads more records than this, not all alike, by columns


def from_records(records: Iterable[dict[str, Any]], source: str, kind: str, key: str | None = None,
                 split_trainings: bool = True, by_rows: bool = False) -> NormHistory:
    """Build a history from dict records (HF log_history entries, JSONL lines, CSV rows). With
    ``split_trainings``, records whose steps start over hold several trainings: the last is read (see
    :func:`_last_training`); records merged from files on purpose (a run's checkpoints) pass False.
    Records of plain numbers with a norm in each are read by :func:`_vectorised`; more than
    ``COLUMNS_FROM_ROWS`` others (evaluation rows among them, values that are strings or None) by
    :func:`from_row_items` on :class:`RecordColumns` (a trainer_state.json of 10^6 steps: 3.2 -> 0.6 s);
    else (``by_rows``: what :func:`from_row_items` hands back) by the loop below, a record at a time."""
    if type(records) is not list or set(map(type, records)) != {dict}:  # the type scan runs in C
        records = [r for r in records if type(r) is dict]
    rows = records
    if not rows:  # --key cannot help: say what is missing
        _no_records(source, kind)
    seen = dict.fromkeys(chain.from_iterable(rows))  # every key, in first-seen order, without a loop per row
    all_keys = {k: None for k in seen if isinstance(k, str)}  # csv puts extra cells under the key None
    nkey, skey, lkey, rkey = _record_keys(all_keys, source, key)
    fast = _vectorised(rows, nkey, skey, lkey, rkey, split_trainings)
    if fast is not None:
        hist = _noted(NormHistory(*fast[:4], source, nkey, kind, fast[4]), fast[5])
        # per-parameter norms from the last training's rows, as below (every row here has a norm)
        return tensor_norms_from(_with_others(hist, all_keys, key), all_keys,
                                 _values_by_step(rows[fast[6]:], skey))
    if split_trainings and not by_rows and len(rows) > COLUMNS_FROM_ROWS:
        try:
            return from_row_items(RecordColumns(rows, list(all_keys)), source, kind, key)
        except OverflowError:  # an int beyond float64's range: the loop raises it as it always did
            pass
    notes: list[str] = []
    if split_trainings and skey:  # the steps of the norm rows, in log order: several trainings?
        ordered = [(i, int(st)) for i, r in enumerate(rows) if _num(r.get(nkey)) is not None
                   and (st := _num(r.get(skey))) is not None and math.isfinite(st)]
        cut, notes = _last_training([st for _, st in ordered])
        if cut:
            rows = rows[ordered[cut][0]:]
    by_step: dict[int, tuple[float, float | None, float | None]] = {}
    order = 0
    last_loss: dict[int, float] = {}  # a loss logged in another row of the same step (Lightning, HF eval rows)
    for r in rows:
        v = _num(r.get(nkey))
        s = _num(r.get(skey)) if skey else None
        lo = _num(r.get(lkey)) if lkey else None
        if v is None:
            if lo is not None and s is not None and math.isfinite(s):
                last_loss[int(s)] = lo
            continue
        step = int(s) if s is not None and math.isfinite(s) else order
        order += 1
        by_step[step] = (v, lo, _num(r.get(rkey)) if rkey else None)
    steps = sorted(by_step)
    hist = NormHistory(steps, [by_step[s][0] for s in steps],
                       [by_step[s][1] if by_step[s][1] is not None else last_loss.get(s) for s in steps],
                       [by_step[s][2] for s in steps], source, nkey, kind)
    return tensor_norms_from(_with_others(_noted(hist, notes), all_keys, key), all_keys,
                             _values_by_step(rows, skey))


def _no_records(source: str, kind: str) -> NoReturn:
    empty = {"trainer_state": "its log_history is empty", "csv": "a header and no rows"}
    raise InputError(f"{source}: {empty.get(kind, 'no records')}: nothing logged yet?")


def _record_keys(all_keys: dict[str, None], source: str, key: str | None) -> tuple[str, str | None,
                                                                                  str | None, str | None]:
    """(norm, step, loss, learning-rate key) of records holding ``all_keys`` (``key``: the norm's, given
    with --key); the norm's missing is an error that lists the keys."""
    nkey = _find_norm_key(all_keys, key)
    if nkey is None:
        if key:
            raise UsageError(f"{source}: no column/key named {key!r}; keys found: {', '.join(list(all_keys)[:20])}")
        raise InputError(f"{source}: found no gradient-norm key among its keys ({listed(all_keys, 12)}); "
                         f"name it with --key{why_no_norm(all_keys)}")
    return (nkey, _find_key(all_keys, STEP_KEYS), *loss_and_lr_keys(all_keys))


class RowItems:
    """Dict records given as columns, as a compiled reader gathers them: the (row, key, value) items of
    ``n_rows`` records in logging order (a record's in its keys' order), ``keys`` the distinct keys in
    first-seen order (``key`` indexes them; no name twice), each value a float64 and whether the log
    wrote it as an int (exact: at most 2^53). A record is ``{keys[k]: value}`` of its items, a later item of a key
    replacing an earlier one (:meth:`records`)."""

    def __init__(self, n_rows: int, keys: list[str], row: Any, key: Any, value: Any, is_int: Any):
        self.n_rows, self.keys = n_rows, keys
        self.row, self.key, self.value, self.is_int = row, key, value, is_int
        self._by_key: tuple[Any, Any] | None = None  # (items in key order, where each key's start)

    def _items_of(self, k: int) -> Any:
        """The items of key ``k`` (in logging order), as a mask of all, or with many keys (a log of each
        parameter's norm: 500 keys of 5,000 rows each were a scan of all 2.5·10^6 items per key, 0.8 s)
        as indices, from the items sorted by key once."""
        import numpy as np

        if len(self.keys) <= 16:
            return self.key == k
        if self._by_key is None:
            order = np.argsort(self.key, kind="stable")
            self._by_key = order, np.searchsorted(self.key[order], np.arange(len(self.keys) + 1))
        order, starts = self._by_key
        return order[starts[k]:starts[k + 1]]

    def column(self, name: str | None) -> tuple[Any, Any, Any]:
        """(given, values, is_int) of key ``name`` over the rows: whether each row has it, its value there
        (NaN where not), and whether that value is an int; a row's last item of the key wins."""
        import numpy as np

        given, values = np.zeros(self.n_rows, dtype=bool), np.full(self.n_rows, np.nan)
        is_int = np.zeros(self.n_rows, dtype=bool)
        if (k := _key_number(self, name)) is not None:
            sel = self._items_of(k)
            rows, vals, ints = self.row[sel], self.value[sel], self.is_int[sel]
            if rows.size > 1:  # a row's last item of the key (rows are in order): NumPy does not promise
                last = np.ones(rows.size, dtype=bool)  # which of repeated indices an assignment keeps
                last[:-1] = rows[1:] != rows[:-1]
                if not last.all():
                    rows, vals, ints = rows[last], vals[last], ints[last]
            given[rows] = True
            values[rows] = vals
            is_int[rows] = ints
        return given, values, is_int

    def records(self) -> list[dict[str, Any]]:
        """The records as dicts (the general path of :func:`from_records`)."""
        out: list[dict[str, Any]] = [{} for _ in range(self.n_rows)]
        names = self.keys
        columns = (self.row.tolist(), self.key.tolist(), self.value.tolist(), self.is_int.tolist())
        for r, k, v, i in zip(*columns):
            out[r][names[k]] = int(v) if i else v
        return out


class KeyColumns:
    """Dict records given as one column per key (the compiled JSON Lines reader's: ``json_rows`` in
    gradtool/io/_logscan.c), with :class:`RowItems`' interface: ``keys`` in first-seen order, each with a
    float64 column of the rows' values (NaN where a row has none) and a uint8 column of flags (0: the row
    has no such key, 1: a float, 2: an int, exact, 3: a word, a string no ``float`` reads: a time, a name;
    not a number to :func:`_num`)."""

    def __init__(self, n_rows: int, keys: list[str], values: list[Any], flags: list[Any]):
        self.n_rows, self.keys = n_rows, keys
        self._values, self._flags = values, flags

    @classmethod
    def of_buffers(cls, n_rows: int, keys: list[str], values: list[Any], flags: list[Any]) -> KeyColumns:
        """From the compiled readers' bytearrays (``json_rows``, ``item_columns``; or arrays), not copied."""
        import numpy as np

        return cls(n_rows, keys, [np.frombuffer(v, np.float64) for v in values],
                   [np.frombuffer(f, np.uint8) for f in flags])

    def column(self, name: str | None) -> tuple[Any, Any, Any]:
        """(given, values, is_int) of key ``name`` over the rows (see :meth:`RowItems.column`)."""
        import numpy as np

        if (k := _key_number(self, name)) is None:
            return (np.zeros(self.n_rows, dtype=bool), np.full(self.n_rows, np.nan),
                    np.zeros(self.n_rows, dtype=bool))
        flags = self._flags[k]
        return (flags == 1) | (flags == 2), self._values[k], flags == 2

    def records(self) -> list[dict[str, Any]]:
        """The records as dicts (the general path of :func:`from_records`); a word as None, which
        :func:`_num` reads as it reads the word."""
        out: list[dict[str, Any]] = [{} for _ in range(self.n_rows)]
        for name, values, flags in zip(self.keys, self._values, self._flags):
            for r in flags.nonzero()[0].tolist():
                f = flags[r]
                out[r][name] = int(values[r]) if f == 2 else None if f == 3 else float(values[r])
        return out


class RecordColumns:
    """Dict records (``rows``, their string ``keys`` in first-seen order) with :class:`RowItems`' interface,
    each key's column made from the dicts when first asked for (:func:`from_row_items` asks for the norm,
    step, loss and learning rate, and per-parameter norms): a value is what :func:`_num` makes of it, by
    ``float`` over the column when it holds only floats, ints and None. :meth:`records` are the rows."""

    def __init__(self, rows: list[dict[str, Any]], keys: list[str]):
        self.rows, self.keys, self.n_rows = rows, keys, len(rows)
        self._made: dict[str, tuple[Any, Any, Any]] = {}

    def column(self, name: str | None) -> tuple[Any, Any, Any]:
        """(given, values, is_int) of key ``name`` over the rows (see :meth:`RowItems.column`): given where
        :func:`_num` makes a number of the row's value, that number, and whether the value is an int."""
        import numpy as np

        if _key_number(self, name) is None:
            return (np.zeros(self.n_rows, dtype=bool), np.full(self.n_rows, np.nan),
                    np.zeros(self.n_rows, dtype=bool))
        if name not in self._made:
            self._made[name] = _number_column(list(map(dict.get, self.rows, repeat(name))))  # type: ignore[index]
        return self._made[name]  # type: ignore[index]

    def records(self) -> list[dict[str, Any]]:
        return self.rows


def _number_column(values: list[Any]) -> tuple[Any, Any, Any]:
    """(given, values, is_int) of a column of logged values as :func:`_num` reads each: floats and ints by
    ``float`` (``_num``'s own conversion of them; a NaN kept as it is), None not given, anything else (a
    string, a bool) by ``_num`` itself."""
    import numpy as np

    n, kinds = len(values), set(map(type, values))  # (maps of C functions: ~4x faster than generators)
    is_int = (np.fromiter(map(operator.is_, map(type, values), repeat(int)), bool, n) if int in kinds
              else np.zeros(n, dtype=bool))
    if kinds <= {float, int}:
        return np.ones(n, dtype=bool), np.fromiter(map(float, values), np.float64, n), is_int
    if kinds <= {float, int, type(None)}:
        given = np.fromiter(map(operator.is_not, values, repeat(None)), bool, n)
        there = [v for v in values if v is not None]
        out = np.full(n, np.nan)
        out[given] = np.fromiter(map(float, there), np.float64, len(there))
        return given, out, is_int
    nums = list(map(_num, values))
    given = np.fromiter((x is not None for x in nums), bool, n)
    out = np.fromiter((math.nan if x is None else x for x in nums), np.float64, n)
    return given, out, is_int


def _key_number(columns: Any, name: str | None) -> int | None:
    """Where ``name`` is in ``columns.keys`` (distinct names), or None: from a dict of them made once (a
    search of the list per key made a log of 65,000 parameters' norms quadratic: 100 s)."""
    numbers = getattr(columns, "_key_numbers", None)
    if numbers is None or len(numbers) != len(columns.keys):
        numbers = columns._key_numbers = {k: i for i, k in enumerate(columns.keys)}
    return numbers.get(name)  # type: ignore[arg-type]


def joined_row_items(parts: list[RowItems]) -> RowItems:
    """The records of ``parts`` one after the other (a resumed run's logs), their keys merged by name."""
    import numpy as np

    if len(parts) == 1:
        return parts[0]
    keys: dict[str, int] = {}
    ids = [np.array([keys.setdefault(k, len(keys)) for k in p.keys], dtype=np.int64) for p in parts]
    first = np.cumsum([0] + [p.n_rows for p in parts[:-1]])
    return RowItems(sum(p.n_rows for p in parts), list(keys),
                    np.concatenate([p.row + f for p, f in zip(parts, first)]),
                    np.concatenate([i[p.key] for p, i in zip(parts, ids)]),
                    np.concatenate([p.value for p in parts]), np.concatenate([p.is_int for p in parts]))


def from_row_items(items: RowItems, source: str, kind: str, key: str | None = None) -> NormHistory:
    """:func:`from_records` of the records ``items`` holds, computed column by column with NumPy (no dict
    per record): the same history. Each norm row's step (its step key's value, else its place among
    the norm rows), the last training (steps starting over: see :func:`_last_training`), a step logged
    twice keeping its later row, the loss and learning rate of that row (a loss logged at that step in
    a row without the norm where the row has none), and the per-parameter norms of :func:`tensor_norms_from`.
    Records from_records would read otherwise (steps beyond 2^53) are handed to it."""
    import numpy as np

    n = items.n_rows
    if not n:
        _no_records(source, kind)
    all_keys = dict.fromkeys(items.keys)
    nkey, skey, lkey, rkey = _record_keys(all_keys, source, key)
    has_norm, norm, _ = items.column(nkey)
    has_step, step, _ = items.column(skey)
    finite = has_step & np.isfinite(step)
    if np.any(np.abs(step[finite]) >= 2.0 ** 53):  # int(step) beyond float64's integers: as the records do
        return from_records(items.records(), source, kind, key, by_rows=True)
    start, notes = 0, []
    if skey is not None:
        at = np.flatnonzero(has_norm & finite)
        steps_there = np.trunc(step[at]).astype(np.int64)
        if steps_there.size > 1 and bool(np.any(steps_there[1:] < steps_there[:-1])):
            cut, notes = _last_training(steps_there.tolist())
            start = int(at[cut]) if cut else 0
    rows = start + np.flatnonzero(has_norm[start:])  # the norm rows of the last training, in log order
    row_steps = np.where(finite[rows], np.trunc(step[rows]), np.arange(rows.size)).astype(np.int64)
    steps, won = last_per_key(row_steps, rows, np.argsort(row_steps, kind="stable"))

    def at_won(name: str | None, fill_from_other_rows: bool = False) -> Any:
        given, values, _ = items.column(name)
        data, mask = values[won], ~given[won]
        if fill_from_other_rows and mask.any():  # a loss logged at the step in a row without the norm
            other = np.flatnonzero(~has_norm[start:] & given[start:] & finite[start:]) + start
            if other.size:
                ks = np.trunc(step[other]).astype(np.int64)
                ks, vs = last_per_key(ks, values[other], np.argsort(ks, kind="stable"))
                at = np.minimum(np.searchsorted(ks, steps), ks.size - 1)
                found = mask & (ks[at] == steps)
                data, mask = np.where(found, vs[at], data), mask & ~found
        return np.ma.MaskedArray(np.where(mask, np.nan, data), mask=mask)

    loss, lr = at_won(lkey, skey is not None), at_won(rkey)
    hist = NormHistory(None, None, None, None, source, nkey, kind, (steps, norm[won], loss, lr))
    hist = _noted(hist, notes)
    low = start  # the rows from_records reads per-parameter norms from: the last training's

    def values_of(wanted: list[str]) -> dict[str, StepValues]:
        out: dict[str, StepValues] = {}
        last = None  # (the rows that give the previous metric, their distinct steps, each one's last row)
        for name in wanted:
            given, values, _ = items.column(name)
            if last is None or not np.array_equal(last[0], given):  # (metrics logged in the same rows: once)
                sel = np.flatnonzero(given[low:] & finite[low:]) + low if skey else np.zeros(0, dtype=np.int64)
                ks = np.trunc(step[sel]).astype(np.int64)
                last = (given, *last_per_key(ks, sel, np.argsort(ks, kind="stable")))
            out[name] = StepValues(last[1], values[last[2]])
        return out

    return tensor_norms_from(_with_others(hist, all_keys, key), all_keys, values_of)


def _noted(hist: NormHistory, notes: list[str]) -> NormHistory:
    """``hist`` with ``notes`` (said of its log) added to its notes, its source named in front."""
    hist.notes.extend(f"{hist.source}: {n}" for n in notes)
    return hist


def _noted_first(hist: NormHistory, notes: list[str]) -> NormHistory:
    """``hist`` with ``notes`` said of its log's text (a last row cut short) before the notes its reading
    made, whichever reader made them."""
    hist.notes[:0] = [f"{hist.source}: {n}" for n in notes]
    return hist


def _last_training(steps: Any, unit: str = "step") -> tuple[int, list[str]]:
    """Where the last training in a log begins, as an index into ``steps`` (the steps of its norm values,
    in log order), and what to say about the log. A step at or below the first step of the
    training so far starts a new training (a second run appended to the same log file, or a run name used
    again: the Trainer's default run name is its output directory); its values must not be merged with
    the earlier run's by step. A step below the one before but above that first step is a run resumed
    from a checkpoint: its values replace those of the steps it logs again. ``unit`` "epoch": ``steps``
    are the epochs of a log without steps (the Trainer's console lines), read in line order."""
    n = len(steps)
    back = [i for i in range(1, n) if steps[i] < steps[i - 1]] if n > 1 else []
    start, restarts, resumes = 0, [], []
    for b in back:
        if steps[b] <= steps[start]:
            start, resumes = b, []
            restarts.append(b)
        else:
            resumes.append(b)
    notes = []
    if restarts:
        b = restarts[-1]
        causes = "runs appended to one log, a run name used again" + (
            ", or steps counted per epoch?" if unit == "step" else "")
        notes.append(f"its {unit}s start over {len(restarts)} time(s) (last at {unit} {steps[b - 1]} then "
                     f"{steps[b]}): it holds {len(restarts) + 1} trainings ({causes}) and only the last is "
                     f"read ({n - b} of {n} values)")
    if resumes:
        b = resumes[0]
        twice = ("a step logged twice counts once, the later value" if unit == "step"
                 else "lines logged again are read again")
        notes.append(f"its {unit}s go back {len(resumes)} time(s) (at {unit} {steps[b - 1]} then {steps[b]}: "
                     f"a run resumed from a checkpoint?); {twice}")
    return start, notes


def _with_others(hist: NormHistory, keys: Iterable[str], explicit: str | None) -> NormHistory:
    """``hist`` with ``other_keys`` set when its norm key was found automatically, and a note when it was
    chosen as the norm before clipping over others."""
    if not explicit:
        hist.other_keys = other_norm_keys(keys, hist.key)
        if _clip_words(hist.key) == "before":
            if after := _norm_keys_besides(keys, hist.key):
                hist.notes.append(f"{hist.source}: the norm before clipping, {hist.key!r}, was taken over "
                                  f"{listed(after, 3, repr)} (then the norm after clipping, never above the "
                                  "threshold in use); --key chooses another")
    return hist


# Per-parameter gradient norms a log may hold beside the global one: Lightning's grad_norm() utility
# (``self.log_dict(grad_norm(self, norm_type=2))``: grad_2.0_norm/<parameter>; with norm_type="inf",
# grad_inf_norm/<parameter>, the max |g|) and Composer's OptimizerMonitor (l2_norm/grad/<parameter>)
_TENSOR_L2_KEY = re.compile(r"(?:grad_2(?:\.0)?_norm/|l2_norm/grad/)(?!global$)(.+)")
_TENSOR_MAX_KEY = re.compile(r"grad_inf_norm/(.+)")


def tensor_norm_keys(keys: Iterable[str], chosen: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """({parameter name: key} of the per-parameter L2 norms among ``keys``, the same of their max |g|).
    When the global norm ``chosen`` is Lightning's ``NAME_step`` (logged with on_step and on_epoch), so
    are the per-parameter ones: ``.../p.weight_step`` is p.weight's, ``.../p.weight_epoch`` an epoch mean."""
    on_step = _epoch_twin(chosen or "") is not None
    l2, mx = {}, {}
    for k in keys:
        if isinstance(k, str) and "/" in k and not (on_step and k.endswith("_epoch")):
            found = _TENSOR_L2_KEY.fullmatch(k), _TENSOR_MAX_KEY.fullmatch(k)
            for m, out in zip(found, (l2, mx)):
                if m:
                    out[m.group(1)[:-len("_step")] if on_step and k.endswith("_step") else m.group(1)] = k
    return l2, mx


class StepValues:
    """A metric's value at each step it was logged at: ``steps`` distinct and increasing (int64), ``values``
    (float64) each step's last (see :func:`last_per_key`); for :func:`tensor_norms_from`, which finds the
    history's steps among them by a binary search (:class:`_AtSteps`) instead of a dict per step (a log
    of 500 parameters' norms over 20,000 steps: 2.8 -> 0.75 s)."""

    def __init__(self, steps: Any, values: Any):
        self.steps, self.values = steps, values


def tensor_norms_from(hist: NormHistory, keys: Iterable[str],
                      values_of: Callable[[list[str]], dict[str, Any]]) -> NormHistory:
    """``hist`` with the per-parameter norms its log holds (:func:`tensor_norm_keys`), each aligned with
    its steps: ``values_of(keys)`` gives each key's {step: value}, or its :class:`StepValues`. A parameter
    whose norm is missing at a step of the history (logged at other steps than the global norm, or only
    for a while) is left out, with a note: a gap would read as a step of no gradient."""
    l2, mx = tensor_norm_keys(keys, hist.key)
    if not (l2 or mx) or hist.line_order:
        return hist
    import numpy as np

    got = values_of([*l2.values(), *mx.values()])
    at_steps = _AtSteps(hist)
    gaps = []
    for names, out in ((l2, hist.tensor_norm_arrays), (mx, hist.tensor_max_abs_arrays)):
        for name, key in names.items():
            by_step = got.get(key, {})
            if isinstance(by_step, StepValues):  # by a binary search, not a dict per step
                column = at_steps(by_step)
            else:
                values = [by_step.get(s) for s in hist.steps]
                column = None if None in values else np.array(values, dtype=np.float64)
            if column is None:
                gaps.append(name)
                continue
            out[name] = column
    if gaps:
        hist.notes.append(f"{hist.source}: per-parameter norms of {listed(sorted(set(gaps)), 3)} left out: "
                          "not logged at every step the global norm is")
    return hist


class _AtSteps:
    """A :class:`StepValues`' values at each step of a history (float64), None when it lacks one: found by
    :func:`values_at`'s binary search, done once for the metrics logged at the same steps (a log's
    per-parameter norms usually are: 500 searches of 20,000 steps were 0.13 s)."""

    def __init__(self, hist: NormHistory):
        self.hist = hist
        self.last: tuple[Any, Any] | None = None  # (the metric steps searched, where the history's are)

    def __call__(self, metric: StepValues) -> Any:
        import numpy as np

        steps = self.hist.arrays()[0]
        if self.last is None or not np.array_equal(self.last[0], metric.steps):
            at = np.zeros(0, dtype=np.intp) if not len(steps) else None
            if len(steps) and len(metric.steps):
                at = np.minimum(np.searchsorted(metric.steps, steps), len(metric.steps) - 1)
                at = at if bool(np.all(metric.steps[at] == steps)) else None
            self.last = metric.steps, at
        at = self.last[1]
        return None if at is None else metric.values[at]


def _values_by_step(rows: Iterable[dict[str, Any]], skey: str | None) -> Callable[[list[str]], dict]:
    """``values_of`` for :func:`tensor_norms_from` over dict records with the step under ``skey`` (a
    later record of a step wins, as it does for the global norm)."""
    def values_of(wanted: list[str]) -> dict[str, dict[int, float | None]]:
        out: dict[str, dict[int, float | None]] = {k: {} for k in wanted}
        if skey is None:
            return out
        for r in rows:
            s = _num(r.get(skey))
            if s is None or not math.isfinite(s):
                continue
            for k in wanted:
                if (v := _num(r.get(k))) is not None:
                    out[k][int(s)] = v
        return out

    return values_of


def _table_values_by_step(table: Any, header: list[str], skey: str | None) -> Callable[[list[str]], dict]:
    """``values_of`` for :func:`tensor_norms_from` over an all-numeric CSV parsed whole (``table``, one
    column per name of ``header``, the step column finite integers): what :func:`_values_by_step` gives
    for its rows, as :class:`StepValues` (a 500-parameter CSV of 20,000 rows: ``suggest-threshold``
    14.1 -> 3.3 s)."""
    import numpy as np

    def values_of(wanted: list[str]) -> dict[str, StepValues]:
        if skey is None:
            return {k: StepValues(np.zeros(0, np.int64), np.zeros(0)) for k in wanted}
        steps = table[:, header.index(skey)].astype(np.int64)
        steps, rows = last_per_key(steps, np.arange(len(steps)), np.argsort(steps, kind="stable"))
        return {k: StepValues(steps, table[rows, header.index(k)]) for k in wanted}

    return values_of


def _column(rows: list[dict[str, Any]], key: str) -> list[Any]:
    """``[r.get(key) for r in rows]`` without a Python call per row when every row has the key (the
    usual log): ``map(itemgetter)`` runs in C, ~6x faster on 10^6 rows."""
    from operator import itemgetter

    try:
        return list(map(itemgetter(key), rows))
    except KeyError:
        return [r.get(key) for r in rows]


def _vectorised(rows: list[dict[str, Any]], nkey: str, skey: str | None, lkey: str | None,
                rkey: str | None, split_trainings: bool = True) -> Columns | None:
    """The common case (plain numbers, integer steps, every row carries the norm) with NumPy instead of a
    Python loop per row. None sends the caller to the general loop."""
    number = {float, int}
    norms = _column(rows, nkey)
    if not norms or not set(map(type, norms)) <= number:
        return None
    extra: list[Any] = []
    for key in (lkey, rkey):
        col = None if key is None else _column(rows, key)
        if col is not None and not set(map(type, col)) <= number | {type(None)}:
            return None
        extra.append(col)
    steps = None
    if skey is not None:
        steps = _column(rows, skey)
        if not set(map(type, steps)) <= {int}:
            return None
    return _columns(steps, norms, extra[0], extra[1], split_trainings=split_trainings)


Columns = tuple[list[int] | None, list[float] | None, list[float | None] | None, list[float | None] | None,
                tuple, list[str], int]  # what _columns gives: the four columns as lists, as arrays, notes,
# and the row the last training starts at


def _columns(steps: Any, norms: Any, loss: Any, lr: Any, types_known: bool = False, lists: bool = True,
             split_trainings: bool = True) -> Columns | None:
    """A history from columns (numbers, or numeric strings from a CSV): the last row of each step kept,
    in step order, as lists and as the arrays ``NormHistory.arrays`` gives. None when a column does not
    convert (empty cells, words): the general loop decides. ``types_known``: the lists already hold exactly
    int steps, float norms and float-or-None loss and learning rate (a typed decoder checked them), so
    they are passed through without scanning their types again. ``lists=False``: columns that are arrays
    are not turned into lists (None in their place; ``NormHistory`` makes them from the arrays on first use).
    Then notes on the log (several trainings in it: only the last is kept; see :func:`_last_training`),
    and the row of the columns as given that the last training starts at (0 for one training)."""
    import numpy as np

    try:
        norm_arr = np.asarray(norms, dtype=np.float64)
        step_arr = np.arange(len(norms), dtype=np.int64) if steps is None else np.asarray(steps, dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        return None
    n = step_arr.size
    in_order = n < 2 or bool(np.all(step_arr[1:] > step_arr[:-1]))  # the usual log: no step twice, sorted
    notes: list[str] = []
    cut = 0
    if not in_order and split_trainings and bool(np.any(step_arr[1:] < step_arr[:-1])):
        cut, notes = _last_training(step_arr.tolist())
        if cut:  # the last training's rows only
            steps, norms, loss, lr = (None if c is None else c[cut:] for c in (steps, norms, loss, lr))
            step_arr, norm_arr = step_arr[cut:], norm_arr[cut:]
            n = step_arr.size
            in_order = n < 2 or bool(np.all(step_arr[1:] > step_arr[:-1]))
    if in_order:
        idx = None  # every row kept, in place: lists of the right types are passed through, not converted
    else:
        idx = np.arange(n)[::-1][np.unique(step_arr[::-1], return_index=True)[1]]

    def kept(col: list[Any], arr: Any, kind: type) -> tuple[list[Any], Any]:
        arr = arr if idx is None else arr[idx]
        if idx is None and type(col) is list and (types_known or set(map(type, col)) <= {kind}):
            return col, arr
        return (arr.tolist() if lists else None), arr

    from ..suggest import masked_column

    def pick(col: list[Any] | None) -> tuple[list[float | None], Any] | None:
        m = n if idx is None else idx.size
        if col is None:
            return ([None] * m if lists else None), masked_column(None, m)
        try:  # numbers, or numeric strings: one NumPy conversion (which would turn None into NaN)
            if not (type(col) is list and None in col):
                values, arr = kept(col, np.asarray(col, dtype=np.float64), float)
                return values, masked_column(arr)  # an array: given everywhere
        except (ValueError, TypeError, OverflowError):
            pass  # empty cells or None: element by element
        out = []
        for i in (range(n) if idx is None else idx.tolist()):
            v = _num(col[i])
            if v is None and col[i] not in (None, ""):
                return None
            out.append(v)
        return out, masked_column(out)

    loss_p, lr_p = pick(loss), pick(lr)
    if loss_p is None or lr_p is None:
        return None
    if steps is None:
        steps_v = list(range(n)) if lists else None
    else:
        steps_v, step_arr = kept(steps, step_arr, int)
    norms_v, norm_arr = kept(norms, norm_arr, float)
    return steps_v, norms_v, loss_p[0], lr_p[0], (step_arr, norm_arr, loss_p[1], lr_p[1]), notes, cut


def _loads(text: str, source: str) -> Any:
    try:
        return _decode_json(text)  # accepts NaN / Infinity / -Infinity
    except (ValueError, RecursionError) as exc:
        raise InputError(_malformed_json(source, text, exc)) from None


def _malformed_json(source: str, text: str, exc: Exception) -> str:
    """The error for a JSON document that does not parse; one that stops before its closing bracket was
    cut short, and says so."""
    if isinstance(exc, RecursionError):
        return f"{source}: JSON nested too deeply to be a training log"
    closer = {"{": "}", "[": "]"}.get(text.lstrip()[:1])
    cut = closer is not None and not text.rstrip().endswith(closer)
    return f"{source}: malformed JSON ({exc})" + (
        f"; the document stops before its closing '{closer}': cut short (a copy interrupted, a full disk, "
        "a file still being written?)" if cut else "")


def _read_text(path: str, source: str | None = None) -> str:
    """The text of the log at ``path`` (``source``, default ``path``, names it in errors). A gzip, bzip2
    or xz-compressed log (``train.log.gz``, rotated or archived logs) is decompressed on the way, to the
    same size limit."""
    from .detect import compression, decompress_first

    source = source or path
    too_big = f"{source}: log larger than {MAX_LOG_BYTES >> 30} GiB"
    comp = None
    try:
        with open(path, "rb") as f:
            comp = compression(f.peek(16)[:16])
            if comp == "zstd":  # not in the standard library before Python 3.14
                raise InputError(f"{source}: is zstd-compressed; {decompress_first(comp, source)}")
            if comp is None and os.path.isfile(path):
                size = os.fstat(f.fileno()).st_size
                if size > MAX_LOG_BYTES:
                    raise InputError(too_big)
                if size >= _MAP_LOG_BYTES and (text := _mapped_text(f, source)) is not None:
                    return text
                raw = f.read()
            elif comp is None:  # a device such as /dev/zero has no size and no end
                raw = _read_bounded(f, too_big)
            else:
                raw = _decompress_bounded(f, comp, source, too_big)
    except OSError as exc:
        raise InputError(f"{source}: cannot read ({exc.strerror or exc})") from None
    return _decoded(raw, source, comp)


# A log this large is decoded from a memory map of its file, not from a copy read into memory: the copy's
# new pages cost more than the read (in-process, a 10^6-line Megatron log 1.69 -> 1.32 s; the Trainer's
# console after a wandb banner, 1.1 GB of text of four-byte characters, 3.28 -> 2.19 s; since read from the
# map's bytes, not decoded: dict_lines.read_mapped_dict_lines). A file truncated while it is decoded or
# read ends the process (SIGBUS): README and SECURITY.md say so
_MAP_LOG_BYTES = 1 << 24


def _mapped_text(f: Any, source: str) -> str | None:
    """The text of the open regular file ``f`` (see :func:`_decoded`) decoded from a read-only memory map
    of it; None where it cannot be mapped (a file system without mmap). The map ends where the file ended
    when it was made: a log still being written is read to there, as ``read`` reads it."""
    import mmap

    try:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    try:
        with memoryview(mapped) as view:
            return _decoded(view, source, None)
    finally:
        mapped.close()


@contextmanager
def mapped_utf8_log(path: str) -> Iterator[tuple[Any, int] | None]:
    """A read-only memory map of the log at ``path`` and where its UTF-8 text starts in it
    (:func:`utf8_text_start`), for a reader of its bytes as they are (no decoded copy of the text); None
    where :func:`_read_text` decodes another way or reports an error: a file that is not regular,
    compressed, smaller than ``_MAP_LOG_BYTES`` or larger than ``MAX_LOG_BYTES``, UTF-16 or binary, or
    that cannot be mapped."""
    import mmap

    from .detect import compression

    mapped = None
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISREG(st.st_mode) and _MAP_LOG_BYTES <= st.st_size <= MAX_LOG_BYTES \
                    and compression(f.peek(16)[:16]) is None:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        mapped = None
    try:
        skip = None if mapped is None else utf8_text_start(mapped)
        yield None if skip is None else (mapped, skip)
    finally:
        if mapped is not None:
            mapped.close()


def utf8_text_start(raw: Any) -> int | None:
    """Where the text of a log's bytes ``raw`` starts when :func:`_decoded` decodes them as UTF-8: 3 after
    UTF-8's byte order mark (Excel's "CSV UTF-8"; not part of the first key), else 0; None for UTF-16 (its
    mark) or bytes that are no text (a NUL byte in the first 4 KiB after the mark, a pickle's opening)."""
    from .detect import is_pickle

    head = bytes(raw[:16])
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return None
    skip = 3 if head.startswith(b"\xef\xbb\xbf") else 0
    if b"\0" in bytes(raw[skip:skip + 4096]) or is_pickle(bytes(raw[skip:skip + 16])):
        return None
    return skip


def _decoded(raw: Any, source: str, comp: str | None) -> str:
    """The text of a log's bytes ``raw`` (bytes, or a memoryview of a mapped file; ``comp``: the compression
    they came out of, or None): UTF-8 (invalid bytes replaced), its byte order mark dropped, or UTF-16 with
    its mark; a binary file (a pickle, a compressed dump, NUL bytes) is an InputError naming ``source``."""
    from .detect import NEVER_PICKLES, decompress_first, is_pickle, sniff

    if (skip := utf8_text_start(raw)) is not None:
        with memoryview(raw)[skip:] as body:
            return str(body, "utf-8", "replace")
    head = bytes(raw[:16])
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16 with its mark: Windows PowerShell's `>`
        return str(raw, "utf-16", "replace").lstrip("\ufeff")
    head = head[3:] if head.startswith(b"\xef\xbb\xbf") else head  # (slices as bytes: no view of a map
    if comp and sniff(head):  # outlives it)
        raise InputError(f"{source}: is a {comp}-compressed gradient dump; {decompress_first(comp, source)}")
    if is_pickle(head):
        raise InputError(f"{source}: is a Python pickle, not a training log; {NEVER_PICKLES}")
    raise InputError(f"{source}: binary file, not a training log")


def _decompress_bounded(f: Any, comp: str, source: str, too_big: str) -> bytes:
    """The decompressed bytes of file ``f`` (``comp``: gzip, bzip2 or xz), up to ``MAX_LOG_BYTES``;
    corrupt or truncated data is an InputError naming ``source``."""
    import bz2
    import gzip
    import lzma
    import zlib

    opener = {"gzip": lambda: gzip.GzipFile(fileobj=f), "bzip2": lambda: bz2.BZ2File(f),
              "xz": lambda: lzma.LZMAFile(f)}[comp]
    stream = opener()
    try:
        return _read_bounded(stream, too_big)
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:  # gzip.BadGzipFile is an OSError
        raise InputError(f"{source}: corrupt or truncated {comp} data ({exc})") from None


def _read_bounded(f: Any, too_big: str) -> bytes:
    """All of ``f`` up to ``MAX_LOG_BYTES`` (InputError ``too_big`` beyond); a first MiB with NUL bytes
    in its first 4 KiB is returned at once, to be refused as binary before megabytes of zeros are read."""
    parts, total = [], 0
    while (part := f.read(1 << 20)):
        if not parts and b"\0" in part[:4096]:
            return part
        parts.append(part)
        total += len(part)
        if total > MAX_LOG_BYTES:
            raise InputError(too_big)
    return b"".join(parts)


def read_trainer_state(path: str, key: str | None = None) -> NormHistory:
    doc = _loads(_read_text(path), path)
    if not isinstance(doc, dict) or not isinstance(doc.get("log_history"), list):
        raise InputError(f"{path}: not a Hugging Face trainer_state.json (no log_history list)")
    return from_records(doc["log_history"], path, "trainer_state", key)


def read_run_directory(path: str, key: str | None = None, run: str | None = None) -> NormHistory:
    """A run directory: trainer_state.json files of its checkpoints (and itself), merged by step; else
    the TensorBoard, MLflow or W&B runs under it, one of them (``run`` chooses among several)."""
    files = trainer_state_files(path)
    if not files:
        return _read_store_of_runs(path, key, run)
    records: list[dict[str, Any]] = []
    unread: list[InputError] = []  # a checkpoint whose save was cut short (a run killed while saving it)
    for f in files:
        try:
            doc = _loads(_read_text(f), f)
        except InputError as exc:
            unread.append(exc)
            continue
        if isinstance(doc, dict) and isinstance(doc.get("log_history"), list):
            records.extend(doc["log_history"])  # later files repeat earlier steps: from_records keeps the last
    if len(unread) == len(files):  # none readable
        raise unread[-1]
    hist = from_records(records, path, "trainer_state", key, split_trainings=False)
    hist.notes.extend(f"{exc}: left out; the other checkpoints' files are read" for exc in unread)
    return hist


def _read_store_of_runs(path: str, key: str | None, run: str | None) -> NormHistory:
    """One of the TensorBoard, Lightning CSVLogger (``version_N/metrics.csv``), MLflow file-store and W&B
    runs under directory ``path`` (``run`` chooses among several; MLflow runs alone are chosen among those
    that logged a gradient norm); else its DVCLive log, or its one MLflow or Trackio database."""
    from .mlflow_store import file_store_runs, read_file_store
    from .runs import Run, choose_run
    from .wandb_log import read_wandb_dir, wandb_runs

    tb = [Run(os.path.relpath(d, path), os.path.relpath(d, path), _newest_mtime(d), d)
          for d in tensorboard_runs(path)]
    mlflow = file_store_runs(path)
    wandb = wandb_runs(path)
    tb_dirs = {r.where for r in tb}  # both loggers writing into one directory: one run, TensorBoard's
    csvs = [Run(*[os.path.relpath(os.path.dirname(f), path)] * 2, os.path.getmtime(f), f)
            for f in csv_logger_runs(path) if os.path.dirname(f) not in tb_dirs]
    stores = (("TensorBoard", tb), ("Lightning CSV", csvs), ("MLflow", mlflow), ("W&B", wandb))
    kinds = [k for k, runs in stores if runs]
    if not kinds:
        from .detect import no_dumps_hint
        from .dvclive_log import dvclive_files, read_dvclive
        from .sqlite_logs import log_databases, read_sqlite_log

        if files := dvclive_files(path):  # dvclive/plots/metrics/<name>.tsv
            return read_dvclive(path, key, files)
        databases = log_databases(path)  # mlflow.db where MLflow ran; Trackio's <project>.db files
        if len(databases) == 1:
            return read_sqlite_log(databases[0], key, run)
        if databases:
            raise UsageError(f"{path}: holds {len(databases)} MLflow or Trackio databases "
                             f"({listed(map(os.path.basename, databases), 4)}); give one of them")
        raise InputError(f"{path}: directory holds no gradient dumps, trainer_state.json, TensorBoard event "
                         f"files, MLflow, Trackio, W&B or DVCLive runs{no_dumps_hint(path)}")
    if kinds == ["MLflow"]:
        return read_file_store(path, key, run, mlflow)
    if kinds == ["TensorBoard"] and len(tb) > 1:  # (Keras' train/ and validation/): the runs with a norm
        from .runs import choose_run_with_norm
        from .tensorboard_log import scalar_series

        series = {r.where: scalar_series(r.where) for r in tb}
        chosen = choose_run_with_norm(tb, lambda r: list(series[r.where]), key, run, path, "TensorBoard",
                                      "a TensorBoard log directory")
        hist = read_tensorboard(chosen.where, key, series[chosen.where])
        hist.run = chosen
        return hist
    chosen = choose_run(tb + csvs + mlflow + wandb, run, path, f"{' or '.join(kinds)} runs")
    if chosen in csvs:
        hist = read_csv(chosen.where, key)
        hist.run = chosen
        return hist
    if chosen in mlflow:
        return read_file_store(path, key, chosen.id, [chosen])
    if chosen in wandb:
        return read_wandb_dir(path, key, chosen.id, [chosen])
    hist = read_tensorboard(chosen.where, key)
    hist.run = chosen
    return hist


def files_by_metric(top: str, suffixes: tuple[str, ...] = ()) -> dict[str, str]:
    """The files under ``top`` of a log that keeps one file per metric (an MLflow file-store run's
    ``metrics/``, DVCLive's ``plots/metrics/``), by metric name: the file's path below ``top`` with ``/``
    between parts (``train/grad_norm``), without its suffix when ``suffixes`` are given (then only files
    with one of them count). Directories and names in sorted order, as ``os.walk`` visits them."""
    out = {}
    for d, subdirs, names in os.walk(top):
        subdirs.sort()
        for n in sorted(names):
            stem, ext = os.path.splitext(n) if suffixes else (n, "")
            if ext in suffixes or not suffixes:
                out[os.path.relpath(os.path.join(d, stem), top).replace(os.sep, "/")] = os.path.join(d, n)
    return out


def _newest_mtime(d: str) -> float | None:
    """When the newest TensorBoard event file in directory ``d`` was last written."""
    times = [os.path.getmtime(os.path.join(d, n)) for n in os.listdir(d) if "tfevents" in n]
    return max(times) if times else None


def trainer_state_files(path: str) -> list[str]:
    """The Hugging Face Trainer's ``trainer_state.json`` files in its output directory ``path``: each
    ``checkpoint-N/``'s in step order, then the final one beside them."""
    def step(p: str) -> int:
        found = re.findall(r"checkpoint-(\d+)", p)
        return int(found[-1]) if found else 0

    files = sorted(glob.glob(os.path.join(glob.escape(path), "checkpoint-*", "trainer_state.json")), key=step)
    top = os.path.join(path, "trainer_state.json")
    return files + [top] if os.path.exists(top) else files


def tensorboard_runs(path: str, depth: int = 3) -> list[str]:
    """The directories under ``path`` (itself included, ``depth`` levels down) that hold TensorBoard event
    files: one per run (a resumed run adds event files to its directory). The Hugging Face Trainer writes
    ``runs/<date_host>/``, Lightning ``lightning_logs/version_N/``."""
    from .runs import walk

    return sorted(d for d, _, names in walk(path, depth) if any("tfevents" in n for n in names))


def csv_logger_runs(path: str, depth: int = 3) -> list[str]:
    """The ``metrics.csv`` files of Lightning's CSVLogger under ``path`` (in it, or ``depth`` levels down):
    ``lightning_logs/version_N/metrics.csv`` beside its ``hparams.yaml``, one per run."""
    from .runs import walk

    return sorted(os.path.join(d, "metrics.csv") for d, _, names in walk(path, depth)
                  if "metrics.csv" in names)


def _decode_json(text: str) -> Any:
    """``json.loads(text)``, by msgspec's C decoder when the extra ``gradtool[speedups]`` is installed (3-5x
    faster: a trainer_state.json of 10^6 steps 1.7 -> 0.5 s). What msgspec does not decode as json does
    (the non-standard NaN/Infinity tokens, lone surrogates, numbers beyond float64's range, malformed
    JSON, nesting deeper than the recursion limit), it refuses, and the standard decoder then decides (and
    words its errors). (msgspec takes documents nested 996-999 deep, a few levels more than json does.)"""
    try:
        import msgspec
    except ImportError:
        return json.loads(text)
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return json.loads(text)  # NaN/Infinity tokens, or a real error that json reports in its words


def _msgspec_lines(text: str) -> list[Any] | None:
    """Every line of a JSON Lines text decoded by msgspec's ``decode_lines`` (no joined copy of the text),
    or None when msgspec is not installed or a line is not strict JSON (garbage, NaN tokens): the caller's
    general path then decides, line by line where it must."""
    try:
        import msgspec
    except ImportError:
        return None
    try:
        return msgspec.json.Decoder().decode_lines(text)
    except msgspec.DecodeError:
        return None


JSONL_SAMPLE_LINES = 1000


def json_columns(text: str | bytes, source: str, key: str | None, kind: str = "jsonl",
                 own_steps: Any = None) -> NormHistory | None:
    """The history of JSON Lines of flat objects of numbers (a JSON Lines log; a Trackio run's rows joined by
    line breaks) read by the compiled reader, ``json_rows`` (gradtool/io/_logscan.c), into one column per
    key, and computed from the columns by :func:`from_row_items`: what :func:`from_records` gives for the
    lines' dicts (10^6 lines: ~0.3 s against ~0.6 s by msgspec into typed rows). ``own_steps``: each line's
    own step (a Trackio row's), kept under ``_step`` after the first line's keys, as a dict record of it
    would have it. None (the decoders decide, with the same result) when the compiled readers are off, or
    a line is anything else: strings that ``float`` may read (but Trackio's ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"``; a string with another character, a time or a name, is no number, as to ``_num``), true,
    false, null, nested values, escapes or non-ASCII text, integers of more than 15 digits, more than 4096
    keys or columns larger than the text; or with ``own_steps``, a ``_step`` key of the log's own or a
    blank line (a row that is no object)."""
    import numpy as np

    from .compiled import log_readers

    readers = log_readers()
    got = None if readers is None else readers.json_rows(text)
    if got is None or not got[0]:
        return None
    n, names, values, flags, first = got
    keys = [name.decode("ascii") for name in names]
    if own_steps is not None:
        steps = np.asarray(own_steps)
        if "_step" in keys or steps.shape != (n,) or steps.dtype.kind not in "iu" or \
                (n and int(np.abs(steps).max()) > 1 << 53):
            return None
        keys.insert(first, "_step")
        values.insert(first, steps.astype(np.float64))
        flags.insert(first, np.full(n, 2, dtype=np.uint8))
    return from_row_items(KeyColumns.of_buffers(n, keys, values, flags), source, kind, key)


def _msgspec_typed(text: str | bytes, path: str, key: str | None, kind: str = "jsonl",
                   own_steps: list[Any] | None = None, nonfinite_words: bool = False) -> NormHistory | None:
    """JSON Lines decoded by msgspec straight into typed rows, without a dict per line: the keys come from
    the first ``JSONL_SAMPLE_LINES`` lines, and a row type with exactly those keys is declared, the norm a
    required float, the step a required int, loss and learning rate optional floats, unknown keys
    forbidden. A line the row type does not fit (a key the sample did not show, a missing norm, a string,
    NaN tokens) makes it give up: None, and the general path (which sees every key of every line) decides,
    so the result is always the general path's. About 2x faster on a 10^6-line log. ``own_steps``: each
    line's step kept beside it (a Trackio row's), which :func:`from_records` would see under ``_step``
    after the line's own keys (None when a line logs a ``_step`` of its own, or a step is not an int).
    ``nonfinite_words``: norm, loss and learning rate may be the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"`` (Trackio's JSON of them), read as those floats, as :func:`_num` reads them."""
    try:
        import msgspec
    except ImportError:
        return None
    cut, newline = -1, b"\n" if isinstance(text, bytes) else "\n"
    for _ in range(JSONL_SAMPLE_LINES):
        cut = text.find(newline, cut + 1)  # type: ignore[arg-type]
        if cut < 0:
            break
    try:
        sample = msgspec.json.Decoder().decode_lines(text if cut < 0 else text[:cut + 1])
    except msgspec.DecodeError:
        return None
    if not sample or any(type(r) is not dict for r in sample):
        return None
    keys = list(dict.fromkeys(chain.from_iterable(sample)))
    seen = keys  # the keys in the order from_records sees them
    if own_steps is not None:
        if "_step" in keys or not set(map(type, own_steps)) <= {int}:
            return None
        seen = [*keys[:len(sample[0])], "_step", *keys[len(sample[0]):]]  # set after the first row's own
    nkey = _find_norm_key(seen, key)
    if nkey is None or any(tensor_norm_keys(seen)):  # per-parameter norms: the dict path reads them
        return None
    skey, (lkey, rkey) = _find_key(seen, STEP_KEYS), loss_and_lr_keys(seen)
    number: Any = float | Literal["NaN", "Infinity", "-Infinity"] if nonfinite_words else float
    # the norm's entry last: --key may name the loss or learning rate, whose optional type must not
    # replace the norm's required one (a row without it is no norm row)
    kinds = {lkey: (number | None, None), rkey: (number | None, None), skey: (int,), nkey: (number,)}
    fields = [(f"f{i}", *kinds.get(k, (msgspec.Raw, msgspec.UNSET))) for i, k in enumerate(keys)]
    try:
        row = msgspec.defstruct("LogRow", fields, rename={f"f{i}": k for i, k in enumerate(keys)},
                                forbid_unknown_fields=True, kw_only=True)
    except (ValueError, TypeError):  # a key msgspec cannot name a field (quotes, backslashes, control
        return None  # characters: found by fuzzing): the dict path reads it
    try:
        rows = msgspec.json.Decoder(row).decode_lines(text)
    except msgspec.DecodeError:  # ValidationError included
        return None
    if own_steps is not None and len(rows) != len(own_steps):  # an empty line: no row of its own
        return None
    from operator import attrgetter

    import numpy as np

    def column(k: str | None, dtype: Any = None) -> Any:
        """The rows' values of key k: a list, or with ``dtype`` straight into an array (no list of 10^6
        Python objects on the way; for the required step and norm only, since ``fromiter`` would turn a
        None into NaN), a list again when they do not fit one (steps beyond int64)."""
        if k is None:
            return None
        mine = own_steps is not None and k == "_step"
        if dtype is not None:
            try:
                return np.fromiter(own_steps if mine else map(attrgetter(f"f{keys.index(k)}"), rows), dtype,
                                   len(rows))
            except (TypeError, ValueError, OverflowError):
                pass
        return own_steps if mine else list(map(attrgetter(f"f{keys.index(k)}"), rows))

    def numbers(col: list[Any] | None) -> list[Any] | None:
        """A loss or learning-rate column with its nonfinite words made floats by :func:`_num` (NumPy
        parses the norm's)."""
        if col is None or not nonfinite_words or str not in set(map(type, col)):
            return col
        return [_num(v) if type(v) is str else v for v in col]

    fast = _columns(column(skey, np.int64), column(nkey, np.float64), numbers(column(lkey)), numbers(column(rkey)),
                    types_known=True, lists=False)
    if fast is None:
        return None
    return _with_others(_noted(NormHistory(*fast[:4], path, nkey, kind, fast[4]), fast[5]), seen, key)


_LOG_HISTORY = re.compile(r'"log_history"\s*:\s*\[')
_PLACEHOLDER = "gradtool: log_history read by columns"


def _trainer_state_columns(text: str, source: str, key: str | None) -> NormHistory | None:
    """The history of a Hugging Face ``trainer_state.json`` (``text``) whose ``log_history`` the compiled
    reader reads as an array of flat objects of numbers (``json_array_rows`` in gradtool/io/_logscan.c,
    json_rows' reader with line breaks anywhere) into one column per key, the rest of the document decoded
    with a placeholder string in the array's place: what ``from_records(json.loads(text)["log_history"])``
    gives when that placeholder is the decoded document's top-level ``log_history`` (the array found was
    the one json.loads keeps: the placeholder appears nowhere else in the text), computed from the columns
    by :func:`from_row_items` (10^6 steps: ~2.2 -> ~0.9 s). None (the document decoded whole decides)
    without the compiled readers, for a text that is not ASCII, or where the array or the document is
    anything else."""
    from .compiled import log_readers

    readers = log_readers()
    m = _LOG_HISTORY.search(text) if readers is not None else None
    if m is None:
        return None
    got = readers.json_array_rows(text, m.end() - 1)  # (None for a str that is not ASCII)
    if got is None or _PLACEHOLDER in text:
        return None
    n, names, values, flags, _, end = got
    try:
        doc = _decode_json(f'{text[:m.end() - 1]}"{_PLACEHOLDER}"{text[end:]}')
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("log_history") != _PLACEHOLDER:
        return None
    keys = [name.decode("ascii") for name in names]
    return from_row_items(KeyColumns.of_buffers(n, keys, values, flags), source, "trainer_state", key)


def _concatenated_objects(text: str) -> list[dict[str, Any]]:
    """The objects of JSON documents written one after another, each over several lines (a record per
    ``json.dump(..., indent=2)``): up to the first that does not parse (a cut last one). Read whether or
    not msgspec is installed (its ``decode_lines`` took them, the standard library's line reader did not)."""
    decoder, out, pos, space = json.JSONDecoder(), [], 0, re.compile(r"\s*")
    while (pos := space.match(text, pos).end()) < len(text):
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            break
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _quoted_nonfinite(text: str) -> str | None:
    """``text`` with Python's JSON tokens ``NaN``, ``Infinity`` and ``-Infinity`` (``json.dump``'s of
    nonfinite floats, which msgspec refuses) quoted, for :func:`_msgspec_typed`'s ``nonfinite_words``;
    None when it holds none. Quotes put inside a string (a key or text naming NaN) leave no valid JSON
    there, so such a log goes on to the standard decoder, as before. A run that logged one NaN norm among
    10^6 lines was read 4x slower than one without."""
    if "NaN" not in text and "Infinity" not in text:
        return None
    return text.replace("NaN", '"NaN"').replace("Infinity", '"Infinity"').replace('-"Infinity"', '"-Infinity"')


def read_jsonl(path: str, key: str | None = None, text: str | None = None) -> NormHistory:
    text = _read_text(path) if text is None else text
    typed = json_columns(text, path, key) or _msgspec_typed(text, path, key)
    if typed is None and (quoted := _quoted_nonfinite(text)) is not None:
        typed = _msgspec_typed(quoted, path, key, nonfinite_words=True)
    if typed is not None:
        return typed
    decoded = _msgspec_lines(text)
    if decoded is not None:
        records = decoded if set(map(type, decoded)) == {dict} else [r for r in decoded if type(r) is dict]
        if not records:
            raise InputError(f"{path}: no JSON objects found")
        return from_records(records, path, "jsonl", key)
    body = text.strip().replace("\r\n", "\n")
    if body.startswith("{") and body.count("\n") == body.count("\n{"):
        lines = None  # every line starts an object: join them without a Python loop per line
        joined = "[" + body.replace("\n", ",") + "]"
    else:
        lines = [line for line in (raw.strip() for raw in text.splitlines()) if line.startswith("{")]
        joined = "[" + ",".join(lines) + "]"
    try:  # fast path: every line is an object, so the file is one JSON array away from a single parse
        records = [r for r in _decode_json(joined) if isinstance(r, dict)]
    except (ValueError, RecursionError):
        if lines is None:
            lines = [line for line in (raw.strip() for raw in text.splitlines()) if line.startswith("{")]
        records = []
        for line in lines:
            try:
                r = json.loads(line)
            except (ValueError, RecursionError):
                continue  # garbage lines are skipped (a crashed run's last line is often cut)
            if isinstance(r, dict):
                records.append(r)
    if not records:
        raise InputError(f"{path}: no JSON objects found")
    return from_records(records, path, "jsonl", key)


def read_csv(path: str, key: str | None = None, text: str | None = None) -> NormHistory:
    """The history of a CSV/TSV log (``text``, else the file ``path``): its rows as the csv module reads
    them, each cell a number by ``_num`` or none, given to :func:`from_records`. Read, with the same
    result, by the first of: the compiled reader's columns (:func:`_csv_columns`), msgspec's or NumPy's
    parse of an all-numeric table (:func:`_csv_fast`), NumPy's of numbers and empty cells
    (:func:`_csv_numbers_with_gaps`), the csv module's dict rows."""
    text = _read_text(path) if text is None else text
    if blank := _LEADING_BLANK_LINES.match(text):  # blank lines before the header: skipped, as pandas does
        text = text[blank.end():]
    first = _first_line(text)
    delim = "\t" if first.count("\t") > first.count(",") else ","
    try:
        header = next(csv.reader([first.rstrip("\r")], delimiter=delim), [])
    except csv.Error as exc:
        raise InputError(f"{path}: malformed CSV header ({exc})") from None
    if not header:
        raise InputError(f"{path}: empty CSV (no header)")
    text, cut = _without_cut_last_row(text, len(header), delim)
    columns = _csv_columns(text, header, delim)  # numbers, words and empty cells, by C
    gaps = columns is None and _may_have_empty_cells(text, delim)
    if gaps:  # numbers and empty cells, by NumPy (before the all-numeric parse, which fails on them)
        columns = _csv_numbers_with_gaps(text, header, delim)
    fast = _csv_fast(text, header, delim, key) if columns is None else None  # else msgspec, NumPy
    if columns is not None:
        hist = _noted_first(from_row_items(columns, path, "csv", key), cut)
        return _note_bucketed(hist, header, text, delim)
    if fast is not None:
        hist = _noted(NormHistory(*fast[0][:4], source=path, key=fast[1], kind="csv", _arrays=fast[0][4]),
                      fast[0][5])
        skey = _find_key(header, STEP_KEYS)
        keys = header
        if fast[2] is not None and len(set(header)) == len(header):
            values_of = _table_values_by_step(fast[2], header, skey)
        elif any(tensor_norm_keys(header, fast[1])):  # per-parameter norms: the rows after the header, from
            # the last training's first, as the general path makes them (blank lines: none here)
            lines = [r for r in csv.reader(io.StringIO(text), delimiter=delim) if r]
            keys = header[:max(map(len, lines[1:]), default=0)]  # the names some row has a cell for
            values_of = _values_by_step((dict(zip(header, r)) for r in islice(lines, 1 + fast[3], None)),
                                        skey)
        else:  # no per-parameter norms: no rows to read
            values_of = _values_by_step((), skey)
        hist = tensor_norms_from(_with_others(hist, keys, key), keys, values_of)  # (from_records' order)
        return _note_bucketed(_noted_first(hist, cut), header, text, delim)
    try:
        table = list(csv.reader(io.StringIO(text), delimiter=delim))
    except csv.Error as exc:
        raise InputError(f"{path}: malformed CSV ({exc})") from None
    header, body = table[0], table[1:]
    rows = [dict(zip(header, r)) for r in body]
    for r, raw in zip(rows, body):
        if len(raw) > len(header):
            r[None] = raw[len(header):]  # type: ignore[index]  # as csv.DictReader does
    return _note_bucketed(_noted_first(from_records(rows, path, "csv", key), cut), header, text, delim)


_LEADING_BLANK_LINES = re.compile(r"(?:[ \t]*\r?\n)+")


def _csv_columns(text: str, header: list[str], delim: str) -> KeyColumns | None:
    """The rows of a CSV (``text``, its ``header`` line first) as :class:`KeyColumns` (one column per header
    name), read by the compiled reader (``csv_columns`` in gradtool/io/_logscan.c) when its cells are
    numbers, NaN/inf words, other words and empty cells (a cell of no number: absent from its row, as
    the general path's ``_num`` makes it) and none is quoted: what the general path's rows give
    :func:`from_records`, without a dict per row (Lightning's ``metrics.csv``, whose rows leave the other
    metrics' cells empty, of 500 parameters' norms over 20,000 steps: 17.4 s, 2.35 GB -> 2.7 s, 0.99 GB;
    a 10^6-row numeric CSV's history 0.32 -> 0.10 s, where msgspec's parse was the fast path). None
    (:func:`_csv_fast`, else the csv module reads it) otherwise, or without the compiled readers, or when
    the header names a column twice."""
    from .compiled import log_readers

    readers = log_readers()
    cut = text.find("\n")
    if readers is None or cut < 0 or len(set(header)) != len(header) or '"' in text[:cut]:
        return None  # (a quote in the header line: the csv module may read on past its line end)
    got = readers.csv_columns(text[cut + 1:], len(header), delim)
    if got is None:
        return None
    rows, width, values, flags = got
    return KeyColumns.of_buffers(rows, header[:width], values[:width], flags[:width])


def _may_have_empty_cells(text: str, delim: str) -> bool:
    """Whether a CSV's text has two delimiters in a row, or one at a line's start or end: an empty cell,
    or a quoted delimiter (a search of the text, no pass of NumPy's)."""
    d = delim
    return d + d in text or d + "\n" in text or "\n" + d in text or d + "\r" in text or text.startswith(d)


def _csv_numbers_with_gaps(text: str, header: list[str], delim: str, block: int = 1 << 23) -> KeyColumns | None:
    """Without the compiled reader, a rectangular CSV (``text``, its ``header`` line first) whose cells
    are numbers or empty, none quoted (Lightning's ``metrics.csv``, whose rows leave the other metrics'
    cells empty), as :class:`KeyColumns`: the empty cells found with NumPy, filled with ``0`` for
    msgspec's or ``loadtxt``'s parse, and marked absent (as ``_num`` makes an empty cell). None when there
    is no empty cell (the fast paths' case), the rows are of other widths, or a cell is no number (the csv
    module reads those). Read a block of whole lines at a time (about ``block`` characters) into columns
    made at their full length first: the copies, the separators' offsets and the parse of one block live
    at once, not of the whole text (Lightning's wide CSV of 197 MB: a peak of 1.9 GB)."""
    import numpy as np

    cut = text.find("\n")
    ncols = len(header)
    if cut < 0 or '"' in text or len(set(header)) != ncols:
        return None
    end = len(text)
    while end > cut + 1 and text[end - 1] in "\r\n":  # (the body's text.rstrip("\r\n"), not copied)
        end -= 1
        if len(text) - end > 4096:  # a tail of blank lines: the csv module's
            return None
    d = delim
    if end <= cut + 1 or not (text.find(d + d, cut + 1, end) >= 0 or text.find(d + "\n", cut + 1, end) >= 0
                              or text.find(d + "\r", cut + 1, end) >= 0 or text.find("\n" + d, cut + 1, end) >= 0
                              or text[cut + 1] == d or text[end - 1] == d):
        return None  # no empty cell (a search of the text, before any NumPy pass)
    rows = text.count("\n", cut + 1, end) + 1  # (rows of another width than the header's: a block says no)
    values = np.empty((ncols, rows))
    given = np.empty((ncols, rows), dtype=np.uint8)
    done, at = 0, cut + 1
    while at < end:
        stop = text.find("\n", min(at + block, end), end)
        stop = end if stop < 0 else stop
        crlf = stop < end and stop > at and text[stop - 1] == "\r"  # (its "\r\n" not cut in two)
        got = _csv_block_with_gaps(text[at:stop - crlf], delim, ncols)
        if got is None or done + got[0].shape[0] > rows:
            return None
        table, empty = got
        values[:, done:done + table.shape[0]] = np.where(empty, np.nan, table).T
        given[:, done:done + table.shape[0]] = ~empty.T
        done, at = done + table.shape[0], stop + 1
    if done != rows:  # (the pre-check above found an empty cell)
        return None
    return KeyColumns(rows, header, list(values), list(given))


def _csv_block_with_gaps(body: str, delim: str, ncols: int) -> tuple[Any, Any] | None:
    """The lines of ``body`` (CSV lines of ``ncols`` cells, numbers or empty) as a (lines, ncols) float64
    table (0 where a cell is empty) and the mask of the empty cells; None when it is not such lines (a
    quote, a cell of no number, a line of another width, a lone "\r", text that is not ASCII)."""
    import numpy as np

    if not body.isascii():
        return None
    if "\r" in body:
        body = body.replace("\r\n", "\n")
        if "\r" in body:
            return None
    raw = np.frombuffer(body.encode("ascii"), np.uint8)
    lines = body.count("\n") + 1
    seps = np.flatnonzero((raw == ord(delim)) | (raw == ord("\n")))
    starts, ends = np.concatenate(([0], seps + 1)), np.concatenate((seps, [raw.size]))
    empty = starts == ends
    filled = np.insert(raw, starts[empty], ord("0")).tobytes().decode("ascii") if empty.any() else body
    table = csv_numbers_msgspec(filled, delim, ncols)
    if table is None:
        import warnings

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                table = np.loadtxt(io.StringIO(filled), delimiter=delim, dtype=np.float64, ndmin=2,
                                   comments=None)
        except (ValueError, IndexError, TypeError):
            return None
    if table.shape != (lines, ncols) or empty.size != lines * ncols:  # every line had ncols cells
        return None
    return table, empty.reshape(lines, ncols)


def _without_cut_last_row(text: str, ncols: int, delim: str) -> tuple[str, list[str]]:
    """A CSV's text without its last row when that row was cut short (a run killed while writing it, a
    file still being written): no line end after it and fewer cells than the header. Its last cell may
    be a number cut mid-digits (``12`` of ``1234.5``), read as a far smaller norm. A last row with all
    its cells is kept: it cannot be told from a whole one. Also what to say of the log."""
    if text.endswith("\n") or (cut := text.rfind("\n")) < 0:
        return text, []
    last = text[cut + 1:].rstrip("\r")
    if not last.strip():
        return text[:cut + 1], []
    try:
        cells = next(csv.reader([last], delimiter=delim), [])
    except csv.Error:  # a quote left open: cut inside it
        cells = []
    if len(cells) >= ncols:
        return text, []
    shown = last if len(last) <= 40 else last[:40] + "..."
    said = (f"its last row ({shown!r}) has {len(cells)} of {ncols} cells and no line end: cut short (a run "
            "killed while writing it, or a file still being written?), left out")
    return text[:cut + 1], [said]


def _differ(a: float | None, b: float | None) -> bool:
    """a != b, with NaN equal to NaN (a bucket of one NaN step)."""
    return a != b and not (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def _note_bucketed(hist: NormHistory, header: list[str], text: str, delim: str) -> NormHistory:
    """``hist`` with a note when it is a W&B chart export whose rows are buckets of several logged steps:
    W&B shows (and exports) a chart of more points than it draws as bucket means, with the bucket's range
    in ``KEY__MIN`` and ``KEY__MAX``; where those differ, a spike within a bucket was averaged away."""
    low, high = f"{hist.key}__MIN", f"{hist.key}__MAX"
    if low not in header or high not in header:
        return hist
    i, j = header.index(low), header.index(high)
    try:
        rows = csv.reader(io.StringIO(text), delimiter=delim)
        next(rows, None)
        bucketed = sum(1 for r in rows if len(r) > max(i, j) and _differ(_num(r[i]), _num(r[j])))
    except csv.Error:
        return hist
    if bucketed:
        hist.notes.append(f"{hist.source}: {bucketed} of its rows are the mean of several logged steps (a "
                          f"W&B chart export, downsampled: {high} differs from {low}): spikes inside them "
                          "are averaged away and clip rates understated; export the run's full history "
                          "(wandb's run.scan_history()) or read its wandb/run-*/*.wandb log")
    return hist


_NEGATIVE_INTEGER_ZERO = re.compile(rb"-0(?![.\deE])")


def csv_numbers_msgspec(body: str, delim: str, ncols: int) -> Any:
    """The lines of a CSV body (the text after its header line) as a (lines, ncols) float64 array, every cell
    parsed by msgspec's C JSON number parser: the body with its line breaks turned into commas is one JSON
    array of numbers. About 2x faster than ``np.loadtxt`` on 10^6 rows, with the same values (both round
    correctly). Every line must hold exactly ``ncols`` cells, counted per line with NumPy before anything is
    decoded. None when msgspec (extra ``gradtool[speedups]``) is not installed or any cell is not a strict
    JSON number (empty cells and blank lines, ``nan``, quotes, ``1.``, ``+1``, ``0x1``, out of float range)
    or is an integer ``-0`` (which msgspec reads as +0.0): the caller's NumPy reader then decides."""
    try:
        import msgspec
    except ImportError:
        return None
    import numpy as np

    body = body.rstrip("\r\n")
    if not body or ncols < 1:
        return None
    if delim != ",":
        if "," in body:  # a comma inside a TSV cell would split it in the JSON array
            return None
        body = body.replace(delim, ",")
    raw = body.encode("utf-8", "replace")
    if b"-" in raw and _NEGATIVE_INTEGER_ZERO.search(raw):  # one memchr first; the regex scan is 20 ms
        return None
    chars = np.frombuffer(raw, np.uint8)
    line_ends = np.flatnonzero(chars == ord("\n"))
    commas = np.flatnonzero(chars == ord(","))
    lines = line_ends.size + 1
    if commas.size != lines * (ncols - 1):
        return None
    if ncols > 1 and line_ends.size:  # commas before the end of line i: exactly (i + 1)(ncols - 1)
        before = np.searchsorted(commas, line_ends)
        if not np.array_equal(before, np.arange(1, lines, dtype=before.dtype) * (ncols - 1)):
            return None
    try:
        values = msgspec.json.decode(b"[" + raw.replace(b"\n", b",") + b"]", type=list[float])
    except msgspec.DecodeError:  # ValidationError included
        return None
    if len(values) != lines * ncols:  # a line of blanks (" ", "\t") is no cell to JSON: "[ ]" is empty
        return None
    return np.fromiter(values, np.float64, len(values)).reshape(lines, ncols)


def _csv_fast(text: str, header: list[str], delim: str,
              key: str | None) -> tuple[tuple, str, Any, int] | None:
    """A rectangular all-numeric CSV parsed in C: by msgspec when the cells are strict JSON numbers
    (:func:`csv_numbers_msgspec`), else by NumPy's ``loadtxt`` (10^6 rows in about a second); None (empty
    cells, words, quotes) sends the caller to the general row-by-row path. Else (the history's columns, the
    norm's key, the whole table from the last training's first row when the log holds per-parameter norms
    and every column parsed, or None, and the row that training starts at)."""
    import numpy as np

    nkey = _find_norm_key(header, key)
    if nkey is None:
        return None
    keys = [_find_key(header, STEP_KEYS), nkey, *loss_and_lr_keys(header)]
    wanted = [header.index(k) for k in keys if k is not None]
    whole = any(tensor_norm_keys(header, nkey))  # per-parameter norms: every column kept (see read_csv)
    import warnings

    cut = text.find("\n")
    table = csv_numbers_msgspec(text[cut + 1:], delim, len(header)) if cut >= 0 else None
    for usecols in ([None] if whole else []) + [wanted]:
        if table is not None:
            break
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "input contained no data": a header-only file (below)
                table = np.loadtxt(io.StringIO(text), delimiter=delim, skiprows=1, dtype=np.float64,
                                   usecols=usecols, ndmin=2, comments=None)
        except (ValueError, IndexError, TypeError):
            continue
        if usecols is None and table.shape[1] != len(header):  # rows of another width than the header's
            table = None
            continue
        if usecols is not None:  # only the wanted columns (a column of words elsewhere)
            whole, wanted = False, list(range(len(wanted)))
    if table is None or table.shape[0] == 0:
        return None
    cols = iter(table[:, wanted].T)
    step_col = next(cols) if keys[0] is not None else None
    if step_col is not None and not (np.all(np.isfinite(step_col)) and np.all(step_col == np.round(step_col))):
        return None
    norms = next(cols)
    loss = next(cols) if keys[2] is not None else None
    lr = next(cols) if keys[3] is not None else None
    result = _columns(None if step_col is None else step_col.astype(np.int64), norms, loss, lr, lists=False)
    if result is None:
        return None
    start = result[6]  # the row the last training starts at (every row has a norm): its per-parameter norms
    return result, nkey, table[start:] if whole else None, start


def read_tensorboard(path: str, key: str | None = None, series: dict[str, Any] | None = None) -> NormHistory:
    """The scalars of a TensorBoard event file, or of a run directory of them (see
    :mod:`~gradtool.io.tensorboard_log`: read without tensorboard, as its ``EventAccumulator`` keeps them,
    and scalars written as tensors as its scalars dashboard shows them)."""
    from .tensorboard_log import scalar_series

    series = scalar_series(path) if series is None else series  # (given: read already)
    tags = list(series)
    if not tags:
        raise InputError(f"{path}: no scalar among its TensorBoard events (histograms, images and tensors of "
                         "other plugins are not read)")
    nkey = _find_norm_key(tags, key)
    if nkey is None:
        raise InputError(f"{path}: no gradient-norm scalar among {', '.join(tags[:20])}; name it with --key"
                         + why_no_norm(tags))
    return from_metric_arrays(tags, nkey, series.__getitem__, path, "tensorboard")


def last_per_key(keys: Any, values: Any, order: Any) -> tuple[Any, Any]:
    """The distinct ``keys`` (steps, or timestamps) in increasing order and each one's last value, "last"
    in ``order`` (indices that sort ``keys``, a key's values in logging order): a step logged twice keeps
    its later value."""
    import numpy as np

    keys, values = keys[order], values[order]
    last = np.ones(len(keys), dtype=bool)
    last[:-1] = keys[:-1] != keys[1:]
    return keys[last], values[last]


def values_at(keys: Any, values: Any, wanted: Any) -> list[float | None]:
    """The value of each of the ``wanted`` keys among the distinct, increasing ``keys`` (None where it has
    none), found by a binary search, not by a dict of 10^6 floats."""
    import numpy as np

    if not len(keys):
        return [None] * len(wanted)
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    out = values[at].tolist()
    for i in np.flatnonzero(keys[at] != wanted).tolist():
        out[i] = None
    return out


def from_metric_arrays(keys: Iterable[str], nkey: str, arrays_of: Callable[[str], tuple[Any, Any]],
                       source: str, kind: str) -> NormHistory:
    """:func:`from_metric_series` of metrics given as arrays (``arrays_of(name)``: steps as int64, values
    as float64, in logging order): the same history, built with NumPy when the log holds some norm, not
    from a dict per step: each metric's last value at each step, the loss and learning rate at the norm's
    steps (None where not logged), each parameter's norm (:class:`StepValues`) at them too (a TensorBoard
    log of 2,000 parameters' norms over 500 steps: 1.9 -> 0.5 s)."""
    import numpy as np

    keys = list(keys)
    l2, mx = tensor_norm_keys(keys, nkey)
    lkey, rkey = loss_and_lr_keys(keys)

    def from_pairs() -> NormHistory:
        return from_metric_series(keys, nkey, lambda name: zip(*(a.tolist() for a in arrays_of(name))),
                                  source, kind)

    if not len(arrays_of(nkey)[0]) or nkey in (lkey, rkey) or (l2 or mx) and not _distinct_keys(
            nkey, lkey, rkey, *l2.values(), *mx.values()):
        return from_pairs()

    def last_at_each_step(name: str) -> tuple[Any, Any]:
        steps, values = arrays_of(name)
        return last_per_key(steps, values, np.argsort(steps, kind="stable"))

    steps, norms = last_at_each_step(nkey)

    def at_norm_steps(name: str | None) -> list[float | None] | None:
        if name is None or not len(arrays_of(name)[0]):  # (a metric of no values is no key of the records)
            return None
        return values_at(*last_at_each_step(name), steps)

    fast = _columns(steps, norms, at_norm_steps(lkey), at_norm_steps(rkey), types_known=True, lists=False)
    if fast is None:
        return from_pairs()
    hist = _noted(NormHistory(*fast[:4], source, nkey, kind, fast[4]), fast[5])
    if not (l2 or mx):
        return hist
    # as from_records makes it of from_metric_series' records (a dict per step, in the order of the steps):
    # the keys in the order they first come in those records, then each parameter's norm at the steps
    names = [k for k in dict.fromkeys((nkey, lkey, rkey, *l2.values(), *mx.values())) if k]
    firsts = {k: (int(a.min()), i) for i, k in enumerate(names) if len(a := arrays_of(k)[0])}
    record_keys = ["step", *sorted(firsts, key=firsts.__getitem__)]
    return tensor_norms_from(_with_others(hist, record_keys, nkey), record_keys,
                             lambda wanted: {k: StepValues(*last_at_each_step(k)) for k in wanted})


def _distinct_keys(*keys: str | None) -> bool:
    """Whether the keys given (None left out) are all different."""
    given = [k for k in keys if k]
    return len(set(given)) == len(given)


def from_metric_series(keys: Iterable[str], nkey: str, series: Any, source: str, kind: str) -> NormHistory:
    """A history from a log that keeps each metric apart (TensorBoard scalars, DVCLive's files): the
    norm ``nkey``, and the loss and learning rate found among ``keys``, each read as (step, value) pairs
    by ``series(name)`` and joined by step (a step given twice keeps its later value)."""
    keys = list(keys)
    l2, mx = tensor_norm_keys(keys, nkey)  # per-parameter norms (Lightning's grad_norm), joined by step too
    records: dict[int, dict[str, Any]] = {}
    for name in dict.fromkeys(k for k in (nkey, *loss_and_lr_keys(keys), *l2.values(), *mx.values()) if k):
        for step, value in series(name):
            records.setdefault(step, {"step": step})[name] = value
    if not records:
        raise InputError(f"{source}: no values of {nkey!r}")
    return from_records([records[s] for s in sorted(records)], source, kind, nkey)


def is_log_file(path: str) -> bool:
    """True when ``path`` looks like a training log rather than a gradient dump."""
    from .detect import detect_format

    return os.path.isfile(path) and detect_format(path) is None


def read_norm_log(path: str, key: str | None = None, *, source: str | None = None,
                  run: str | None = None) -> NormHistory:
    """Read any supported training log (format detected from name and content); ``source`` (default
    ``path``) names it in errors and in the result, e.g. ``<stdin>`` for a spooled copy of standard input.
    The cyclic garbage collector is paused meanwhile: a 10^6-line log makes millions of objects that hold
    no cycles, and its repeated full scans of them cost more than the parse."""
    from .base import collector_paused

    with collector_paused():
        return _read_norm_log(path, key, source or path, run)


def _read_norm_log(path: str, key: str | None, source: str, run: str | None = None) -> NormHistory:
    from . import mlflow_store
    from .dict_lines import no_norm_in_dict_lines, read_dict_lines, read_mapped_dict_lines
    from .text_logs import _csv_header_like, _is_json, read_text_log
    from .detect import SQLITE_MAGIC, head_of

    if os.path.isdir(path):
        return read_run_directory(path, key, run)
    base = re.sub(r"\.(gz|bz2|xz)$", "", os.path.basename(source).lower())  # metrics.csv.gz is a CSV
    if "tfevents" in base:
        return read_tensorboard(path, key)
    head = head_of(path)
    if head.startswith(SQLITE_MAGIC):  # mlflow.db, MLflow's default store; a Trackio project
        from .sqlite_logs import read_sqlite_log

        return read_sqlite_log(path, key, run, source)
    from . import wandb_log

    if wandb_log.is_wandb_log(head):  # wandb/run-<date>-<id>/run-<id>.wandb
        return wandb_log.read_wandb_file(path, key, source, run)
    csv_name = base.endswith((".csv", ".tsv"))
    if not csv_name and (console := read_mapped_dict_lines(path, key, source, _reads_dict_lines_first)):
        return console  # (a large console of dict lines, read from its bytes: what the text's reading gives)
    text = _read_text(path, source)
    at = _SPACES.match(text).end()  # type: ignore[union-attr]  # the first character that is no space
    if at == len(text):
        raise InputError(f"{source}: empty log")
    first = _first_line(text, at, at_cr=True)  # (found, not split off: text.lstrip() copies a 50 MB log)
    if mlflow_store.is_metric_file_text(first):  # mlruns/<experiment>/<run>/metrics/grad_norm
        return mlflow_store.read_metric_file(path, text, key, source)
    # a JSON array opens with [ then { (or is empty); "[rank0]: step: 1 ...", "[2024-01-01 ...] INFO" are text
    opening = text[at]
    dict_lines_read = False
    if opening == "{" or (opening == "[" and _next_character(text, at + 1) in ("{", "]", "")):
        stripped = text[at:]
        if opening == "{":
            if (state := _trainer_state_columns(text, source, key)) is not None:
                return state
            error: Exception | None = None
            try:
                doc = _decode_json(text)
            except (ValueError, RecursionError) as exc:
                doc, error = None, exc
            if isinstance(doc, dict) and isinstance(doc.get("log_history"), list):
                return from_records(doc["log_history"], source, "trainer_state", key)
            if isinstance(doc, dict):
                return from_records([doc], source, "jsonl", key)
            if "'" in first and not _is_json(first):  # {'loss': ...} lines: Python reprs, not JSON
                if (console := read_dict_lines(source, key, text)) is not None:
                    return console
                try:  # (JSON Lines after a dict printed first: nested records, which dict lines leave)
                    return read_jsonl(source, key, text)
                except InputError:  # a text log's lines after a config printed as a dict: read below
                    dict_lines_read = True
            else:
                if first.strip() == "{" and error is not None:  # "{" on a line of its own: an indented
                    if records := _concatenated_objects(stripped):  # document, or records dumped one
                        return from_records(records, source, "jsonl", key)  # after another
                    raise InputError(_malformed_json(source, stripped, error))
                return read_jsonl(source, key, text)
        else:
            doc = _loads(text, source)
            if isinstance(doc, list):
                return from_records(doc, source, "json", key)
    if (not csv_name and not dict_lines_read and "{" in text
            and (console := read_dict_lines(source, key, text))):
        return console
    if csv_name or (("," in first or "\t" in first) and "{" not in first and _csv_header_like(first, key)):
        if run is None:
            return read_csv(source, key, text)
        column, chosen = _export_run_column(first, run, key, source)
        hist = read_csv(source, column, text)
        hist.run = chosen
        return hist
    try:
        return read_text_log(source, key, text)
    except (InputError, UsageError):  # no norm found: a console of dict lines says what it holds
        if "{" in text and (error := no_norm_in_dict_lines(source, key, text)) is not None:
            raise error from None
        raise


_SPACES = re.compile(r"\s*")


def _reads_dict_lines_first(head: str, whole: bool) -> bool:
    """Whether :func:`_read_norm_log` reads a text that starts with ``head`` (the whole text when
    ``whole``), not a CSV by its name, by :func:`~gradtool.io.dict_lines.read_dict_lines` before any other
    reader (the others are tried only when that finds no norm): its first line, by which the kind of log
    is told, is in ``head``, is no MLflow metric file's line, and opens with neither "[" nor "{", or with
    "{" and a quote (``{'loss': ...``: no JSON, so the trainer_state.json reader and the JSON decoder, tried
    before, stop at the quote)."""
    from .mlflow_store import is_metric_file_text

    at = _SPACES.match(head).end()  # type: ignore[union-attr]
    if at == len(head) or (not whole and head.find("\n", at) < 0 and head.find("\r", at) < 0):
        return False
    first = _first_line(head, at, at_cr=True)
    if is_metric_file_text(first) or first[0] == "[":
        return False
    return first[0] != "{" or re.match(r"\{\s*'", first) is not None


def _next_character(text: str, start: int) -> str:
    """The first character of ``text`` from ``start`` on that is no space ("" when there is none)."""
    at = _SPACES.match(text, start).end()  # type: ignore[union-attr]
    return text[at:at + 1]


def _first_line(text: str, start: int = 0, at_cr: bool = False) -> str:
    """The line of ``text`` that starts at ``start``, without its "\\n" (a copy of that line only); with
    ``at_cr``, up to a "\\r" before it too: the line a log's kind is told by (a log of progress-bar
    updates, each after a "\\r", has one "\\n" at its end: its whole text was that line, split into cells
    to see whether it is a CSV header, ~35 us an update; a CSV's header, which the csv module reads to its
    "\\n", keeps its "\\r")."""
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    cr = text.find("\r", start, end) if at_cr else -1
    return text[start:end if cr < 0 else cr]


def _export_run_column(header_line: str, run: str, key: str | None, source: str) -> tuple[str, Any]:
    """The norm column of run ``run`` in a W&B export of several runs, whose columns are named
    ``"<run> - <metric>"`` (``__MIN``/``__MAX`` beside them): ``--run`` chooses as it does in a store."""
    from .runs import Run, choose_run

    delim = "\t" if "\t" in header_line and "," not in header_line else ","
    header = next(csv.reader([header_line.lstrip("\ufeff")], delimiter=delim), [])
    runs = sorted({c.split(" - ", 1)[0] for c in header if " - " in c})
    chosen = choose_run([Run(r, r) for r in runs], run, source, "runs in its columns ('RUN - metric')")
    prefix = f"{chosen.name} - "
    metrics = [c[len(prefix):] for c in header if c.startswith(prefix) and not c.endswith(("__MIN", "__MAX"))]
    found = _find_norm_key(metrics, key)
    if found is None:
        what = f"column {key!r}" if key else "gradient-norm column"
        raise (UsageError if key else InputError)(
            f"{source}: run {chosen.name!r} has no {what} (its columns: {listed(metrics, 8)})")
    return prefix + found, chosen
