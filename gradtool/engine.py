"""Where the statistics of a history are computed: in this process (default) or on a Dask cluster.

``engine="dask"`` (extra ``gradtool[dask]``) sends one task per file (per shard for sharded steps) to
``dask.distributed`` workers: a ``LocalCluster`` on this machine's cores, or an existing cluster at
``scheduler`` (or ``DASK_SCHEDULER_ADDRESS``). Each task returns small per-tensor partial statistics
(:class:`~gradtool.core.stats.StatsAccumulator`: counts, extremes, partial sums of squares); the client
merges them. Sums of squares are added with ``math.fsum``, so norms do not depend on the order the
partials arrive in; means and variances are combined with Chan's formula (agreement with the local
engine to ~1e-15 relative). A worker that dies mid-run is survived: Dask reruns its tasks elsewhere.
Files must be readable by every worker at the same path (a shared filesystem).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .backend import dtype_name, is_floating_dtype
from .core.norms import parse_norm_type
from .errors import InputError, UsageError
from .io.base import metadata_step
from .io.history import DumpRef, OnUnreadable, fallback_steps, open_each
from .summarize import DumpSummary, name_selected, summarize_dump

ENGINES = ("local", "dask")


def file_partials(path: str, group: str | None, fmt: str | None, select: Sequence[str], exclude: Sequence[str],
                  norm_type: float) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], Any, Any]], str]:
    """One worker task: (metadata, [(name, shape, dtype, accumulator)], format) of one file."""
    from .io.dump import open_dump
    from .summarize import streamed_accumulator

    delay = float(os.environ.get("GRADTOOL_TEST_TASK_DELAY", "0") or 0)  # test hook: slow tasks down
    if delay:
        import time

        time.sleep(delay)
    out = []
    with open_dump(path, group=group, format=fmt) as reader:
        for info in reader.tensors:
            if name_selected(info.name, select, exclude):
                out.append((info.name, info.shape, info.dtype, streamed_accumulator(reader, info, norm_type)))
        return dict(reader.metadata), out, reader.format


def merge_partials(ref: DumpRef, parts: list[tuple[dict[str, Any], list, str]], norm_type: float) -> DumpSummary:
    """The summary of one step from its files' partials (several for a sharded step)."""
    meta: dict[str, Any] = {}
    merged: dict[str, list] = {}
    for m, tensors, _ in parts:
        for k, v in m.items():
            meta.setdefault(k, v)
        for name, shape, dtype, acc in tensors:
            if name in merged:
                entry = merged[name]
                if entry[2] != dtype:
                    raise InputError(f"{ref.path}: tensor {name!r} has pieces of different dtypes")
                entry[3].merge(acc)
                entry[1] = (entry[3].n,)  # several pieces: a flat logical tensor
            else:
                merged[name] = [name, shape, dtype, acc]
    step = ref.step if ref.step is not None else metadata_step(meta)
    fmt = "sharded" if ref.shards is not None else parts[0][2]
    summary = DumpSummary(ref.path, fmt, ref.group, step, norm_type, meta)
    if ref.shards is not None:
        summary.shards = list(ref.shards)
    for name, shape, dtype, acc in merged.values():
        summary.tensors.append((name, acc.result(tuple(shape), dtype_name(dtype), is_floating_dtype(dtype))))
    return summary


def summarize_refs(refs: Sequence[DumpRef], *, select: Sequence[str] = (), exclude: Sequence[str] = (),
                   norm_type: float | int | str = 2, xp: Any = None, engine: str = "local",
                   scheduler: str | None = None, on_dump: Callable[[int], None] | None = None,
                   on_unreadable: OnUnreadable | None = None) -> list[DumpSummary]:
    """Summaries of every dump of a history, with the local engine or Dask. With ``on_unreadable``, a
    dump that cannot be opened or read is reported to it (its label, the InputError) and left out."""
    p = parse_norm_type(norm_type)
    if engine == "local":
        out: list[DumpSummary | None] = [None] * len(refs)
        for i, summary in each_summary(refs, select=select, exclude=exclude, norm_type=p, xp=xp,
                                       on_dump=on_dump, on_unreadable=on_unreadable):
            out[i] = summary
        return with_fallback_steps(refs, out)
    if engine != "dask":
        raise UsageError(f"--engine must be one of {', '.join(ENGINES)}")
    if xp is not None:
        raise UsageError("--engine dask computes on the workers' CPUs; use --backend numpy with it")
    from .io.dump import spooled_copy

    if any(r.path == "-" or spooled_copy(r.path) for r in refs):
        raise UsageError("--engine dask workers cannot read standard input or a pipe; "
                         "save the dump to a file first")
    summaries = _summarize_dask(refs, select, exclude, p, scheduler, on_dump, on_unreadable)
    return with_fallback_steps(refs, summaries)


def each_summary(refs: Sequence[DumpRef], *, select: Sequence[str] = (), exclude: Sequence[str] = (),
                 norm_type: float = 2.0, xp: Any = None, on_dump: Callable[[int], None] | None = None,
                 on_unreadable: OnUnreadable | None = None) -> Iterator[tuple[int, DumpSummary]]:
    """(position in ``refs``, summary) of each dump in turn, computed here (the local engine), one dump
    held at a time: a caller that keeps what it needs of each (a history's series, its output) does not
    hold every tensor's statistics of every step. Steps are the metadata's or None: see
    :func:`with_fallback_steps` for the rest. ``on_unreadable`` as in :func:`summarize_refs`."""
    position = {id(ref): i for i, ref in enumerate(refs)}
    for ref, reader in open_each(refs, on_unreadable):
        try:
            summary = summarize_dump(reader, step=ref.step, select=select, exclude=exclude, norm_type=norm_type,
                                     xp=xp)
        except InputError as exc:
            if on_unreadable is None:
                raise
            on_unreadable(ref.label, exc)
        else:
            yield position[id(ref)], summary
        if on_dump:
            on_dump(1)


def with_fallback_steps(refs: Sequence[DumpRef],
                        summaries: Sequence[DumpSummary | None]) -> list[DumpSummary]:
    """``summaries`` (of ``refs``, in order; None for a dump left out as unreadable), each without a step
    (none given, none in its metadata) given its file name's or its position's
    (:func:`~gradtool.io.history.fallback_steps`): refs from ``expand_inputs(resolve_steps=False)`` get the
    steps ``expand_inputs`` would have given them. The summaries, without the Nones. (Anything with a
    ``step`` is taken as a summary: ``dump_history``'s series.)"""
    known = [None if summary is None else summary.step for summary in summaries]
    for summary, step in zip(summaries, fallback_steps(refs, known)):
        if summary is not None:
            summary.step = step
    return [summary for summary in summaries if summary is not None]


def dask_client(scheduler: str | None) -> Any:
    """A client of the cluster at ``scheduler`` (or DASK_SCHEDULER_ADDRESS), else of a new LocalCluster."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise UsageError("--engine dask needs Dask: pip install 'gradtool[dask]'") from None
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    if address:
        try:
            return Client(address, timeout="10s")
        except OSError as exc:
            raise UsageError(f"cannot reach the Dask scheduler at {address} ({exc})") from None
    cluster = LocalCluster(n_workers=os.cpu_count() or 1, threads_per_worker=1, processes=True,
                           dashboard_address=":0", silence_logs=50)
    client = Client(cluster)
    client._gradtool_cluster = cluster  # closed with the client
    return client


def close_client(client: Any) -> None:
    cluster = getattr(client, "_gradtool_cluster", None)
    client.close()
    if cluster is not None:
        cluster.close()


def _summarize_dask(refs: Sequence[DumpRef], select: Sequence[str], exclude: Sequence[str], p: float,
                    scheduler: str | None, on_dump: Callable[[int], None] | None,
                    on_unreadable: OnUnreadable | None = None,
                    client: Any = None) -> list[DumpSummary | None]:
    from dask.distributed import as_completed

    own = client is None
    client = client or dask_client(scheduler)
    try:
        jobs: list[tuple[int, Any]] = []  # (index of the step, future of one of its files)
        for i, ref in enumerate(refs):
            files = ref.shards if ref.shards is not None else [ref.path]
            fmt = None if ref.shards is not None else ref.format
            for f in files:
                jobs.append((i, client.submit(file_partials, os.path.abspath(f), ref.group, fmt, list(select),
                                              list(exclude), p, pure=False)))
        left = {i: sum(1 for j, _ in jobs if j == i) for i in range(len(refs))}
        step_of = {f.key: i for i, f in jobs}
        results: dict[str, Any] = {}
        unreadable: set[int] = set()
        for fut in as_completed([f for _, f in jobs]):
            i = step_of[fut.key]
            try:
                results[fut.key] = fut.result()  # a GradtoolError raised on a worker arrives as itself
            except InputError as exc:
                if on_unreadable is None:
                    raise
                if i not in unreadable:  # a sharded step: its first unreadable shard speaks for it
                    on_unreadable(refs[i].label, exc)
                unreadable.add(i)
            left[i] -= 1
            if left[i] == 0 and on_dump:
                on_dump(1)
        return [None if i in unreadable
                else merge_partials(ref, [results[f.key] for j, f in jobs if j == i], p)
                for i, ref in enumerate(refs)]
    finally:
        if own:
            close_client(client)
