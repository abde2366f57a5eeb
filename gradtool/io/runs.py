"""Choosing one training run from a store that holds several (an MLflow tracking store, a directory of
TensorBoard runs): by ``--run NAME``, ``--run ID`` (or a unique prefix of it) or ``--run latest``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..errors import InputError, UsageError, listed

RUN_HELP = "choose one with --run NAME, --run ID or --run latest"


@dataclass(frozen=True)
class Run:
    """One run of a store: ``id`` (MLflow's run ID, a TensorBoard run's directory), ``name`` (MLflow's run
    name, the directory relative to the path given), ``started`` (seconds since the epoch, None when not
    known) and ``where`` (the path or database key its metrics are read from)."""

    id: str
    name: str
    started: float | None = None
    where: str = ""
    parts: tuple[str, ...] = ()  # a W&B run resumed: its logs, in order (``where`` is the first)

    def label(self) -> str:
        """e.g. ``'bright-owl-7' (3f2a9c1e, 2026-11-20 10:02 UTC)``, for messages."""
        extra = [self.id[:8]] if self.id and self.id != self.name else []
        if self.started is not None:
            extra.append(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.started)))
        return repr(self.name) + (f" ({', '.join(extra)})" if extra else "")


def walk(path: str, depth: int) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk`` of ``path`` (symbolic links to directories not followed), ``depth`` levels down at most,
    subdirectories in name order: where run directories are looked for."""
    top = os.path.normpath(path).count(os.sep)
    for d, subdirs, names in os.walk(path):
        if os.path.normpath(d).count(os.sep) - top >= depth:
            subdirs.clear()
        subdirs.sort()
        yield d, subdirs, names


def newest_first(runs: Sequence[Run]) -> list[Run]:
    """``runs`` from the most recently started (runs of unknown start last, by name)."""
    return sorted(runs, key=lambda r: (r.started is None, -(r.started or 0.0), r.name))


def choose_run(runs: Sequence[Run], wanted: str | None, source: str, what: str) -> Run:
    """The run of ``runs`` (found in ``source``; ``what`` names them, e.g. "MLflow runs with a gradient
    norm") that ``wanted`` names: an exact ID or name, a prefix of one ID, or ``latest`` (the last
    started). Without ``wanted`` the only run; several are a UsageError listing them, newest first."""
    if not runs:
        raise UsageError(f"{source}: holds no {what}")
    order = newest_first(runs)
    if wanted is None:
        if len(runs) == 1:
            return runs[0]
        raise UsageError(f"{source}: holds {len(runs)} {what} ({listed(order, 4, Run.label)}); {RUN_HELP}")
    if wanted == "latest":
        return order[0]
    for exact in ([r for r in runs if r.id == wanted], [r for r in runs if r.name == wanted]):
        if len(exact) == 1:
            return exact[0]
        if exact:
            raise UsageError(f"{source}: {len(exact)} {what} are named {wanted!r} "
                             f"({listed(newest_first(exact), 4, Run.label)}); choose one by its ID")
    prefixed = [r for r in runs if r.id.startswith(wanted)]
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:
        raise UsageError(f"{source}: --run {wanted!r} is the start of {len(prefixed)} run IDs "
                         f"({listed(newest_first(prefixed), 4, Run.label)}); give more of it")
    raise UsageError(f"{source}: no run {wanted!r} among its {len(runs)} {what} "
                     f"({listed(order, 4, Run.label)})")


def choose_run_with_norm(runs: Sequence[Run], keys_of: Callable[[Run], list[str]], key: str | None,
                         wanted: str | None, source: str, kind: str, store: str) -> Run:
    """The run of a store of ``kind`` ("MLflow", "Trackio"; ``store`` names one, "an MLflow store") to
    read, by :func:`choose_run`: among the runs whose metric names (``keys_of(run)``) hold a gradient norm
    (``key``, or one found), or among all when ``wanted`` names a run, so that a run without a norm is
    told so rather than not found."""
    from .logs import NORM_KEYS, _find_norm_key, why_no_norm

    if not runs:
        raise InputError(f"{source}: {store} with no runs")
    by_name = wanted not in (None, "latest")  # a run named: among all; latest: the last with a norm
    candidates = runs if by_name else [r for r in runs if _find_norm_key(keys_of(r), key)]
    if not candidates:
        seen = sorted({k for r in runs for k in keys_of(r)})
        tried = ", ".join(NORM_KEYS[:4])
        named = f"no metric {key!r}" if key else f"no gradient-norm metric (tried {tried}, ...)"
        raise InputError(f"{source}: {named} in its {len(runs)} {kind} run(s) (metrics: {listed(seen, 12)})"
                         + ("" if key else f"; name it with --key{why_no_norm(seen)}"))
    what = f"{kind} runs" if by_name else f"{kind} runs with a gradient norm"
    return choose_run(candidates, wanted, source, what)
