"""`gradtool stats`: per-tensor and global norms of one dump or a whole history."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import click

from ..errors import listed
from .common import (backend_option, engine_options, format_option, norm_type_option, progress, select_options,
                     numbered_groups_option, sharded_option, skip_unreadable_option)

TENSOR_FIELDS = ["name", "shape", "dtype", "size", "norm", "avg_norm", "max_abs", "mean", "std",
                 "nan_count", "inf_count", "zero_count", "l2_norm", "min", "max", "is_float"]

EXAMPLES = """
\b
Examples:
  gradtool stats step_00100.npz                 # table of every tensor, global norm
  gradtool stats run.h5 --sort norm --top 5     # history: the 5 largest steps, and a sparkline
  gradtool stats dumps/ --format json | jq '.dumps[].global_norm'
  gradtool stats dumps/ --format csv > norms.csv
  gradtool stats --fail-on-nonfinite dumps/ && echo "all finite"
  gradtool stats dumps/ --skip-unreadable       # while training still writes its last dump
  gradtool stats run.h5::step_00000005          # one step group of an HDF5 history

\b
A history is several files, a directory of dumps, or an HDF5 file whose top-level groups carry an
integer `step` attribute (or are all named as steps: step_100/, step_200/; bare numbers, 100/, 200/,
with --numbered-groups-are-steps). JSON writes NaN/inf as the strings "NaN", "Infinity", "-Infinity".
"""


def _norm_type_json(p: float) -> Any:
    return "inf" if math.isinf(p) else int(p)


def tensor_record(name: str, s: Any) -> dict[str, Any]:
    """A tensor's TENSOR_FIELDS, in that order, as one dict literal (a 20,000-tensor dump's JSON record
    took 113 ms through ``as_dict`` and a filtered copy, 64 ms so)."""
    return {"name": name, "shape": list(s.shape), "dtype": s.dtype, "size": s.size, "norm": s.norm,
            "avg_norm": s.avg_norm, "max_abs": s.max_abs, "mean": s.mean, "std": s.std,
            "nan_count": s.nan_count, "inf_count": s.inf_count, "zero_count": s.zero_count,
            "l2_norm": s.l2_norm, "min": s.min, "max": s.max, "is_float": s.is_float}


def _sorted(tensors: list, sort: str | None, top: int | None) -> list:
    if sort == "name":
        tensors = sorted(tensors, key=lambda t: t[0])
    elif sort == "norm":
        tensors = sorted(tensors, key=lambda t: (not t[1].norm != t[1].norm, t[1].norm), reverse=True)
    elif sort == "size":
        tensors = sorted(tensors, key=lambda t: t[1].size, reverse=True)
    return tensors[:top] if top is not None else tensors


def dump_record(summary: Any, sort: str | None, top: int | None, tensors: bool = True) -> dict[str, Any]:
    """A dump's JSON record; ``tensors=False`` leaves its tensors' records out (an empty list), for an
    output that shows none of them (a history's table: 20,000 tensors' records were 35 ms a dump)."""
    name, norm = summary.largest
    return {
        "path": summary.path,
        "format": summary.format,
        "group": summary.group,
        "step": summary.step,
        "num_tensors": summary.num_tensors,
        "num_elements": summary.num_elements,
        "global_norm": summary.global_norm,
        "norm_type": _norm_type_json(summary.norm_type),
        "max_tensor": name,
        "max_tensor_norm": norm,
        "nonfinite_tensors": summary.nonfinite_tensors,
        "shards": summary.shards,
        "metadata": summary.metadata,
        "tensors": TensorRecords(_sorted(summary.tensors, sort, top)) if tensors else [],
    }


class TensorRecords(Sequence):
    """A dump's tensors' records (:func:`tensor_record`), each made when it is asked for and not kept:
    20,000 tensors' dicts held at once were ~30 MB (the JSON output encodes them a block at a time:
    :func:`~gradtool.cli.render.json_list_item`)."""

    def __init__(self, tensors: list[tuple[str, Any]]) -> None:
        self._tensors = tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [tensor_record(n, s) for n, s in self._tensors[i]]
        return tensor_record(*self._tensors[i])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (tensor_record(n, s) for n, s in self._tensors)


@click.command("stats", epilog=EXAMPLES, short_help="Per-tensor and global norms, max |g|, NaN/Inf counts.")
@click.argument("dumps", nargs=-1, required=True, metavar="DUMP...")
@select_options
@norm_type_option
@click.option("--sort", type=click.Choice(["name", "norm", "size"]), default=None,
              help="Order tensors by name, norm (largest first) or size (largest first); default: file order. "
                   "For a history, --sort norm also orders the per-step table by global norm.")
@click.option("--top", type=click.IntRange(min=1), default=None, metavar="N",
              help="Show only the first N tensors (and, for a history table, the first N steps).")
@click.option("--per-tensor/--no-per-tensor", default=None,
              help="Tables: also print every dump's tensor table for a history (default: only for one dump).")
@format_option()
@click.option("--fail-on-nonfinite", is_flag=True, help="Exit 3 (naming tensors and steps) if any NaN/Inf is found.")
@sharded_option
@numbered_groups_option
@skip_unreadable_option
@engine_options
@backend_option
def stats_command(dumps: tuple[str, ...], select: tuple[str, ...], exclude: tuple[str, ...], norm_type: str,
                  sort: str | None, top: int | None, per_tensor: bool | None, fmt: str, fail_on_nonfinite: bool,
                  sharded: bool, skip_unreadable: bool, engine: str, scheduler: str | None,
                  backend: str | None, numbered_groups: bool = False) -> None:
    """Per-tensor and global gradient norms, max |g|, NaN/Inf counts of DUMP (files, directories, or a
    multi-step HDF5 file). Several dumps form a history: a per-step table and a sparkline follow."""
    from ..core.norms import parse_norm_type
    from ..errors import ExitCode, GradtoolError
    from ..io.history import expand_inputs, fallback_step, no_readable_dump
    from ..summarize import summarize_dump
    from .common import SkippedDumps, check_selection, spooled_inputs, warn_unmatched_selects, warning, xp_for

    xp = xp_for(backend)
    skipped = SkippedDumps()
    on_unreadable = skipped if skip_unreadable else None
    output = stats_output(fmt, per_tensor)
    seen: set[str] | None = set() if select else None  # the tensor names, for --select's warning
    # - and pipes are read once: a multi-step HDF5 file is opened per step
    with spooled_inputs(dumps), output:
        # steps from metadata when each dump is opened, below (not in an extra pass)
        refs = expand_inputs(list(dumps), sharded=sharded, resolve_steps=False, on_warning=warning,
                             on_unreadable=on_unreadable, numbered_groups_are_steps=numbered_groups)
        check_selection(refs, select, exclude)
        step_of = fallback_step(refs)

        def add(summary: Any) -> None:
            if seen is not None:
                seen.update(n for n, _ in summary.tensors)
            output.add(dump_record(summary, sort, top, tensors=output.shows_tensors()))

        if engine == "local" and len(refs) == 1 and not skipped:  # one dump: the bar counts its tensors
            with refs[0].open() as reader, progress(len(reader.tensors), "stats") as advance:
                summary = summarize_dump(reader, step=refs[0].step, select=select, exclude=exclude,
                                         norm_type=norm_type, xp=xp, on_tensor=advance)
            summary.step = step_of(0, summary.step)
            add(summary)
        else:
            from ..engine import each_summary, summarize_refs

            with progress(len(refs), "stats") as advance:
                if engine == "local":  # each dump's output made as it is read, none of them held
                    for i, summary in each_summary(refs, select=select, exclude=exclude,
                                                   norm_type=parse_norm_type(norm_type), xp=xp,
                                                   on_dump=advance, on_unreadable=on_unreadable):
                        summary.step = step_of(i, summary.step)
                        add(summary)
                else:
                    for summary in summarize_refs(refs, select=select, exclude=exclude, norm_type=norm_type,
                                                  xp=xp, engine=engine, scheduler=scheduler, on_dump=advance,
                                                  on_unreadable=on_unreadable):
                        add(summary)
            if not output.records:
                raise no_readable_dump(dumps, len(skipped))
        if seen is not None:
            warn_unmatched_selects(select, seen)
        output.write(skipped)
        if fmt == "table" and len(output.records) > 1:
            _print_history(output.in_order(), sort, top, output.out)
    if fail_on_nonfinite:
        bad = [(r["step"], r["path"], r["group"], r["nonfinite_tensors"]) for r in output.in_order()
               if r["nonfinite_tensors"]]
        if bad:
            parts = [f"step {s} ({(p + '::' + g) if g else p}): {', '.join(names)}" for s, p, g, names in bad]
            raise GradtoolError("non-finite values (NaN/Inf) in " + "; ".join(parts), exit_code=ExitCode.NONFINITE)


STEP_FIELDS = ["step", "path", "group", "global_norm", "max_tensor", "max_tensor_norm", "nonfinite_tensors"]


def stats_output(fmt: str, per_tensor: bool | None) -> Any:
    """What ``stats`` prints of its dumps' records (:func:`dump_record`), made one dump at a time and
    written in step order (:class:`~gradtool.cli.render.RecordsOutput`): of each dump only its per-step
    table's row (STEP_FIELDS) is held. A table shows each dump's tensors with ``--per-tensor``, a lone
    dump's unless ``--no-per-tensor``."""
    from .render import RecordsOutput

    return RecordsOutput(fmt, ["path", "group", "step"], TENSOR_FIELDS, STEP_FIELDS, _print_tensor_table,
                         tables="all" if per_tensor else "lone" if per_tensor is None else "none")


def _step_rows(records: list[dict[str, Any]], sort: str | None, top: int | None) -> list[dict[str, Any]]:
    """The per-step table's rows: --sort norm orders steps by global norm (largest first), --top cuts."""
    rows = list(records)
    if sort == "norm":
        def key(r: dict[str, Any]) -> tuple[bool, float]:
            nan = math.isnan(r["global_norm"])
            return nan, 0.0 if nan else r["global_norm"]  # NaN steps first: they matter most

        rows.sort(key=key, reverse=True)
    return rows[:top] if top is not None else rows


def _title(record: dict[str, Any]) -> str:
    """A dump's table title: its path (and group), step, format, and the loss and learning rate its
    metadata gives (the Recorder's ``loss=``, ``lr=``; ``np.savez(..., loss=loss)``'s scalars)."""
    from ..io.base import LOSS_KEYS, LR_KEYS
    from ..summarize import metadata_number
    from .render import human

    scalars = [(name, metadata_number(record["metadata"], keys)) for name, keys in (("loss", LOSS_KEYS),
                                                                                    ("lr", LR_KEYS))]
    where = record["path"] + (f"::{record['group']}" if record["group"] else "")
    return f"{where}  (step {record['step']}, {record['format']}" + "".join(
        f", {name} {human(v)}" for name, v in scalars if v is not None) + ")"


def _counted(record: dict[str, Any], kinds: list[tuple[str, bool, int]]) -> str:
    """"N tensors, E elements" of a dump's record (``kinds``: its tensors' (name, is_float, size)), those
    the global norm counts: the integer, bool and complex tensors it leaves out are named after them."""
    skipped = [name for name, is_float, _ in kinds if not is_float]
    if not skipped:
        return f"{record['num_tensors']} tensors, {record['num_elements']} elements"
    counted = [size for _, is_float, size in kinds if is_float]
    return (f"{len(counted)} floating-point tensors, {sum(counted)} elements "
            f"(not counted: {listed(skipped, 5)})")


def _print_tensor_table(r: dict[str, Any], out: Any) -> None:
    """A dump's table of tensors (its record ``r``), and its global norm."""
    from . import render

    kinds: list[tuple[str, bool, int]] = []  # (what _counted needs, taken as the rows are made: a dump's
    # TensorRecords make each record when asked, and 20,000 held at once were ~11 MB more)

    def rows() -> Iterator[list[Any]]:
        for t in r["tensors"]:
            kinds.append((t["name"], t["is_float"], t["size"]))
            yield [t["name"], t["shape"], t["dtype"], t["norm"], t["avg_norm"], t["max_abs"], t["mean"],
                   t["std"], t["nan_count"], t["inf_count"], t["zero_count"]]

    render.print_table(_title(r), ["tensor", "shape", "dtype", "norm", "avg norm", "max |g|", "mean", "std",
                                   "NaN", "Inf", "zeros"], rows(),
                       right=["norm", "avg norm", "max |g|", "mean", "std", "NaN", "Inf", "zeros"], out=out)
    nf = r["nonfinite_tensors"]
    render.print_line(f"global norm {render.human(r['global_norm'])} over {_counted(r, kinds)}"
                      + (f"; NON-FINITE: {', '.join(nf)}" if nf else ""), out)
    out.print()


def _print_history(records: list[dict[str, Any]], sort: str | None, top: int | None, out: Any) -> None:
    """A history's per-step table (``records``: each step's row, in step order) and sparkline."""
    from . import render

    shown = _step_rows(records, sort, top)
    title = f"{len(records)} steps"
    if sort == "norm":
        title += f" (top {len(shown)} by global norm)"
    elif len(shown) < len(records):
        title += f" (the first {len(shown)}; --sort norm for the largest)"
    render.print_table(title, ["step", "global norm", "max tensor norm", "max tensor", "non-finite"],
                       ([r["step"], r["global_norm"], r["max_tensor_norm"], r["max_tensor"],
                         len(r["nonfinite_tensors"])] for r in shown),
                       right=["step", "global norm", "max tensor norm", "non-finite"], out=out)
    norms = [r["global_norm"] for r in records]
    finite = [v for v in norms if math.isfinite(v)]
    render.print_line(f"global norm, steps {records[0]['step']}..{records[-1]['step']} "
                      "(log scale, ! = NaN/Inf):", out)
    render.print_line(render.sparkline(norms, width=max(8, min(80, out.width))), out)  # one line
    if finite:
        median = sorted(finite)[len(finite) // 2]
        render.print_line(f"min {render.human(min(finite))}  median {render.human(median)}"
                          f"  max {render.human(max(finite))}", out)
