"""`gradtool clip`: apply a clipping mode with thresholds, write the clipped dump, report what changed."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import click

from .common import (
    backend_option,
    format_option,
    numbered_groups_option,
    progress,
    select_options,
    sharded_option,
    skip_unreadable_option,
)

REPORT_TENSOR_FIELDS = ["name", "norm_before", "norm_after", "clipped", "clipped_elements", "threshold", "skipped"]

EXAMPLES = """
\b
Examples:
  gradtool clip step_00100.npz -o clipped.npz --mode global-norm --max 5
  gradtool clip dumps/ -o clipped/ --mode norm --max 1 --select 'encoder.*'
  gradtool clip g.h5 -o g_clipped.h5 --mode norm --max 1 --axes -1 --select '*weight'
  gradtool clip g.npz -o - --mode value --max 0.01 | gradtool stats -
  gradtool clip run.h5 -o run_clipped.h5 --mode global-norm \\
      --max "$(gradtool suggest-threshold run.h5 --mode global-norm --format value)"
  gradtool clip g.npz --dry-run --mode average-norm --max 1e-4 --format json
  gradtool clip dumps/ -o clipped/ --mode global-norm --max 5 --skip-unreadable

\b
Modes (TensorFlow semantics): value = clip_by_value to [--min, --max] (default min = -max);
norm = clip_by_norm per tensor (L2 over --axes, default all); average-norm = clip_by_average_norm
(L2 norm / element count); global-norm = clip_by_global_norm over all selected tensors (--use-norm,
--norm-type). Unclipped tensors are written back bit-identical; non-float tensors pass through.
"""


def _parse_axes(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(a) for a in value.split(",") if a.strip() != "")
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 0,1 or -1") from None


def _load_thresholds(path: str | None, mode: str) -> dict[str, float] | None:
    if path is None:
        return None
    from ..errors import InputError

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read thresholds ({exc})") from None
    table = doc.get("thresholds") if isinstance(doc, dict) else None
    if isinstance(table, dict) and mode in table and isinstance(table[mode], dict):
        table = table[mode]
    elif isinstance(table, dict) and table and all(isinstance(v, dict) for v in table.values()):
        raise InputError(f"{path}: no per-tensor thresholds for --mode {mode} (it has: {', '.join(table)})")
    if not isinstance(table, dict) or not all(isinstance(v, (int, float)) for v in table.values()):
        raise InputError(f"{path}: expected {{\"thresholds\": {{\"<mode>\": {{\"tensor name\": number, ...}}}}}}")
    return {str(k): float(v) for k, v in table.items()}


def _check_thresholds_apply(refs: list[Any], table: dict[str, float], path: str) -> None:
    """A usage error when no tensor of any dump has an entry in the ``--thresholds`` table and no ``--max``
    covers the others: a table made for another model would clip nothing, silently. Reads dump indexes
    until one has a tensor of the table (the first, usually)."""
    from ..errors import UsageError, listed
    from .common import dumps_phrase, names_if_none_match

    sample = names_if_none_match(refs, table.__contains__)
    if sample is None:
        return
    raise UsageError(f"{path}: none of its tensor names ({listed(table, 3)}) is a tensor of "
                     f"{dumps_phrase(refs)} "
                     f"(whose names look like: {', '.join(sample[:3]) or 'none'}); "
                     "were these thresholds made for another model?")


def _plan_outputs(sources: list[str], output: str | None, dry_run: bool, many: bool,
                  makedirs: Callable[[str], None]) -> dict[str, str | None]:
    """Map each source file to its output path (None for a dry run, '-' for stdout)."""
    from ..errors import UsageError

    if dry_run:  # writes nothing, whatever -o says
        return {s: None for s in sources}
    if output is None:
        raise UsageError("give an output with -o FILE (or DIR for several inputs, - for stdout), or use --dry-run")
    if output == "-":
        if many:
            raise UsageError("-o - writes one dump to stdout; give a single input")
        if sys.stdout.isatty():
            raise UsageError("refusing to write a binary dump to a terminal; redirect stdout or give -o FILE")
        return {sources[0]: "-"}
    if many or os.path.isdir(output):
        from ..io.dump import spooled_copy, stream_name

        stream = next((s for s in sources if spooled_copy(s) is not None), None)
        if stream is not None:  # '-' or a pipe such as /dev/fd/63: no name worth keeping
            raise UsageError(f"{output} is a directory, and {stream_name(stream)} (a stream) has no file "
                             f"name to write into it: give -o {os.path.join(output, 'NAME.npz')}"
                             + (f" and clip {stream} on its own" if many else ""))
        _check_directory_name(output, "a directory of dumps" if len(sources) == 1 else "more than one dump")
        makedirs(output)
        outs = {s: os.path.join(output, os.path.basename(s)) for s in sources}
        names = list(outs.values())
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise UsageError(f"several inputs share the output name {sorted(dup)[0]}; clip them separately")
        return outs
    return {sources[0]: output}


def _check_directory_name(output: str, what: str) -> None:
    """A UsageError when ``output``, the directory the clipped dumps of ``what`` (the inputs, said in the
    message) are written into, does not exist and is named as a dump file is (``-o clipped.h5``): a user
    who wrote that wanted one file, and found a directory of that name (a directory that exists is written
    into, whatever its name)."""
    from ..errors import UsageError
    from ..io.detect import format_from_extension

    if not os.path.isdir(output) and format_from_extension(output) is not None:
        stem = os.path.splitext(output)[0] or "clipped"
        raise UsageError(f"{output}: {what} is written into a directory, one file per dump, and {output} is "
                         f"named as a file: give a directory (-o {stem}{os.sep}), or make {output} first to "
                         "write into a directory of that name")


@click.command("clip", epilog=EXAMPLES, short_help="Apply value / norm / average-norm / global-norm clipping.")
@click.argument("dumps", nargs=-1, required=True, metavar="DUMP...")
@click.option("-o", "--output", default=None, metavar="OUT",
              help="Output file (one input), directory (several inputs), or - for stdout.")
@click.option("--mode", type=click.Choice(["value", "norm", "average-norm", "global-norm"]), required=True,
              help="Clipping mode.")
@click.option("--max", "max_", type=float, default=None, metavar="X",
              help="Clip norm (norm modes) or upper bound (value).")
@click.option("--min", "min_", type=float, default=None, metavar="Y", help="Lower bound for value mode (default -X).")
@click.option("--axes", default=None, metavar="A,B", help="Axes of the L2 norm for --mode norm (TF's axes), e.g. 0,1 or -1.")
@click.option("--use-norm", type=float, default=None, metavar="N",
              help="Global-norm mode: use N as the global norm instead of computing it (TF's use_norm).")
@click.option("--norm-type", type=click.Choice(["2", "1", "inf"]), default="2", show_default=True,
              help="Global-norm mode: the norm (PyTorch's total-norm definition).")
@click.option("--thresholds", "thresholds_file", default=None, metavar="FILE",
              help="Per-tensor thresholds (JSON from `suggest-threshold --per-tensor -o FILE`).")
@select_options
@click.option("--nonfinite", type=click.Choice(["error", "propagate", "zero"]), default="error", show_default=True,
              help="NaN/Inf: stop and write nothing; propagate as TensorFlow does; or zero them first.")
@click.option("--force", is_flag=True, help="Replace an existing output file (never an input).")
@click.option("--dry-run", is_flag=True, help="Report what would change; write nothing.")
@click.option("--no-fsync", "no_fsync", is_flag=True,
              help="Do not flush outputs to disk before renaming them into place (as cp does): faster on big "
                   "dumps; an interrupted gradtool still leaves no partial file, but after a power failure "
                   "or OS crash an output may be empty or incomplete.")
@click.option("--per-tensor/--no-per-tensor", default=None,
              help="Tables: every dump's tensor table even for a history (default: only for one dump).")
@format_option()
@sharded_option
@numbered_groups_option
@skip_unreadable_option
@backend_option
def clip_command(dumps: tuple[str, ...], output: str | None, mode: str, max_: float | None, min_: float | None,
                 axes: str | None, use_norm: float | None, norm_type: str, thresholds_file: str | None,
                 select: tuple[str, ...], exclude: tuple[str, ...], nonfinite: str, force: bool, dry_run: bool,
                 per_tensor: bool | None, fmt: str, sharded: bool, backend: str | None,
                 no_fsync: bool = False, skip_unreadable: bool = False,
                 numbered_groups: bool = False) -> None:
    """Clip the gradients of DUMP with --mode and --max, write the clipped dump to -o, and report, per
    tensor, the norm before and after and whether it was clipped. Inputs are never modified."""
    from ..clip_dump import ClipSpec, clip_dump
    from ..errors import UsageError
    from ..io.atomic import check_output_path, output_directories
    from ..io.detect import output_format
    from ..io.dump import make_writer
    from ..io.history import expand_inputs, fallback_step, open_each
    from .common import SkippedDumps, check_selection, spooled_inputs, warn_unmatched_selects, warning, xp_for

    spec = ClipSpec(mode=mode, max=max_, min=min_, axes=_parse_axes(axes), use_norm=use_norm,
                    norm_type=float(norm_type), nonfinite=nonfinite, select=select, exclude=exclude,
                    thresholds=_load_thresholds(thresholds_file, mode)).validate()
    # a failed run takes back the directories it made; - and pipes are read once (global-norm reads twice)
    with output_directories() as makedirs, spooled_inputs(dumps):
        xp = xp_for(backend)
        skipped = SkippedDumps()  # with --skip-unreadable: dumps that do not open get no output
        # a lone dump's step is taken when it is opened to be clipped, not by an open beforehand (a
        # 20,000-tensor file: 0.15-0.5 s an open); a history's dumps are opened up front
        refs = expand_inputs(list(dumps), sharded=sharded, on_warning=warning, defer_lone_step=True,
                             on_unreadable=skipped if skip_unreadable else None,
                             numbered_groups_are_steps=numbered_groups)
        check_selection(refs, select, exclude)
        if spec.thresholds and spec.max is None:
            _check_thresholds_apply(refs, dict(spec.thresholds), str(thresholds_file))
        if any(r.shards is not None for r in refs):
            if xp is not None:
                raise UsageError("sharded steps are clipped on the NumPy backend")
            reports = _clip_sharded(refs, output, spec, force, dry_run, makedirs, durable=not no_fsync)
            warn_unmatched_selects(select, _selected_names(reports), "floating-point tensor")
            _render(reports, fmt, sys.stdout, per_tensor, skipped)
            return
        sources = list(dict.fromkeys(r.path for r in refs))
        many = len(sources) > 1 or any(os.path.isdir(d) for d in dumps)
        outputs = _plan_outputs(sources, output, dry_run, many, makedirs)
        all_inputs = [s for s in sources]
        for out in outputs.values():
            if out not in (None, "-"):
                check_output_path(out, force=force, inputs=all_inputs)
        report_stream = sys.stderr if output == "-" else sys.stdout
        step_of = fallback_step(refs)  # the metadata's step, else the file name's, else the position's
        place = {id(ref): i for i, ref in enumerate(refs)}
        considered: set[str] = set()  # the float tensors selected, over every dump (for --select's warning)
        report = clip_output(fmt, per_tensor, report_stream)
        single = len(refs) == 1
        total = len(refs)
        if single and sys.stderr.isatty():  # one dump: count tensor passes (global-norm reads each twice)
            with refs[0].open() as r:  # for the progress bar only, which a terminal alone shows (an open of
                total = len(r.tensors) * (2 if mode == "global-norm" else 1)  # 20,000 tensors: ~0.3 s)
        with report:
            with progress(total, "clip") as progress_advance:
                per_tensor_advance = progress_advance if single else None

                def done(ref: Any, result: Any, written_to: str | None) -> None:
                    """A dump clipped: its report made (not held), the bar advanced."""
                    record = _record(result, written_to)
                    record["step"] = step_of(place[id(ref)], record["step"])
                    considered.update(_selected_names([record]))
                    report.add(record)
                    if not single:
                        progress_advance(1)

                for source in sources:
                    src_refs = [r for r in refs if r.path == source]
                    target = outputs[source]
                    fmt_in = src_refs[0].format
                    if target is None:
                        for ref, reader in open_each(src_refs):
                            done(ref, clip_dump(reader, None, spec, step=ref.step, xp=xp,
                                                on_tensor=per_tensor_advance), None)
                        continue
                    out_fmt = output_format(target, fmt_in) if target != "-" else fmt_in
                    final = target
                    with (_output_file(target, force, all_inputs, durable=not no_fsync) as tmp,
                          ExitStack() as stack):
                        history = any(r.group for r in src_refs)
                        first_meta = {} if history else None
                        writer = None
                        for ref, reader in open_each(src_refs):
                            if writer is None:  # an npz written like the first input: compressed or not
                                compress = bool(getattr(reader, "compressed", False)) and fmt_in == "npz"
                                writer = stack.enter_context(make_writer(tmp, out_fmt, first_meta,
                                                                         compress=compress))
                            meta = reader.metadata_outside_members()
                            if history:
                                writer.begin_step(ref.group, meta)
                            else:
                                writer.metadata.update(meta)
                                _set_root_meta(writer, meta)
                            done(ref, clip_dump(reader, writer, spec, step=ref.step, xp=xp,
                                                on_tensor=per_tensor_advance), final)
            warn_unmatched_selects(select, considered, "floating-point tensor")
            _write_report(report, fmt, per_tensor, skipped)


def clip_output(fmt: str, per_tensor: bool | None, stream: Any) -> Any:
    """What ``clip`` reports of its dumps (:func:`_record`), made one dump at a time, in the order they
    are clipped (:class:`~gradtool.cli.render.RecordsOutput`): of each dump only its row of the steps'
    table is held. A table shows each dump's tensors with ``--per-tensor``, else a lone dump's."""
    from .render import RecordsOutput

    return RecordsOutput(fmt, ["input", "group", "step", "output"], REPORT_TENSOR_FIELDS, STEP_FIELDS,
                         _print_report_table, tables="all" if per_tensor else "lone", by_step=False,
                         stream=stream)


STEP_FIELDS = ["input", "group", "step", "output", "mode", "max", "global_norm_before", "global_norm_after",
               "scale", "clipped_tensors", "clipped_elements"]


def _write_report(report: Any, fmt: str, per_tensor: bool | None, skipped: list | None) -> None:
    """The report's records (:func:`clip_output`), then, for a table of several dumps without
    --per-tensor, the steps' table."""
    report.write(skipped)
    if fmt == "table" and len(report.records) > 1 and not per_tensor:
        _render_history(report.in_order(), report.out)


def _selected_names(reports: list[dict[str, Any]]) -> set[str]:
    """The float tensors a clip run considered (selected), over all its reports."""
    return {t["name"] for r in reports for t in r["tensors"] if t["skipped"] is None}


def _set_root_meta(writer: Any, meta: dict[str, Any]) -> None:
    if writer.format == "hdf5" and meta:
        writer.set_group_attrs("", meta)


class _output_file:
    """atomic_output for a path, or a temp file copied to stdout for '-'."""

    def __init__(self, target: str, force: bool, inputs: list[str], durable: bool = True):
        self.target, self.force, self.inputs, self.durable = target, force, inputs, durable

    def __enter__(self) -> str:
        if self.target == "-":
            fd, self.tmp = tempfile.mkstemp(prefix="gradtool-clip-")
            os.close(fd)
            return self.tmp
        from ..io.atomic import atomic_output

        self._cm = atomic_output(self.target, force=self.force, inputs=self.inputs, durable=self.durable)
        return self._cm.__enter__()

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        if self.target != "-":
            return bool(self._cm.__exit__(et, ev, tb))
        try:
            if et is None:
                with open(self.tmp, "rb") as f:
                    shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)
                sys.stdout.buffer.flush()
        finally:
            os.unlink(self.tmp)
        return False


def _record(res: Any, output: str | None) -> dict[str, Any]:
    spec = res.spec
    lo, hi = spec.bounds()
    return {
        "input": res.input, "group": res.group, "step": res.step, "output": output, "mode": spec.mode,
        "max": hi, "min": lo if spec.mode == "value" else None,
        "axes": list(spec.axes) if spec.axes is not None else None, "use_norm": spec.use_norm,
        "norm_type": "inf" if math.isinf(spec.norm_type) else int(spec.norm_type), "nonfinite": spec.nonfinite,
        "global_norm_before": res.global_norm_before, "global_norm_after": res.global_norm_after,
        "scale": res.scale, "clipped_tensors": res.clipped_tensors, "clipped_elements": res.clipped_elements,
        "tensors": [{"name": t.name, "norm_before": t.norm_before, "norm_after": t.norm_after, "clipped": t.clipped,
                     "clipped_elements": t.clipped_elements, "threshold": t.threshold, "skipped": t.skipped}
                    for t in res.tensors],
    }


def _render(reports: list[dict[str, Any]], fmt: str, stream: Any, per_tensor: bool | None = None,
            skipped: list | None = None) -> None:
    with clip_output(fmt, per_tensor, stream) as report:
        for r in reports:
            report.add(r)
        _write_report(report, fmt, per_tensor, skipped)


def _print_report_table(r: dict[str, Any], out: Any) -> None:
    """A dump's table of what clipping changed in each tensor (its record ``r``), and its global norm."""
    from . import render

    where = r["input"] + (f"::{r['group']}" if r["group"] else "")
    dest = r["output"] or "(dry run, nothing written)"
    render.print_table(f"{where} -> {dest}  (step {r['step']}, {r['mode']}, max {render.human(r['max'])})",
                       ["tensor", "norm before", "norm after", "clipped", "elements changed"],
                       ([t["name"], t["norm_before"], t["norm_after"],
                         t["clipped"] if not t["skipped"] else t["skipped"], t["clipped_elements"]]
                        for t in r["tensors"]),
                       right=["norm before", "norm after", "elements changed"], out=out)
    scale = f", scale {render.human(r['scale'])}" if r["scale"] is not None else ""
    before, after = render.human(r["global_norm_before"]), render.human(r["global_norm_after"])
    render.print_line(f"global norm {before} -> {after}{scale}; {r['clipped_tensors']} tensors, "
                      f"{r['clipped_elements']} elements changed", out)
    out.print()


def _render_history(reports: list[dict[str, Any]], out: Any) -> None:
    """Several dumps: one line per step that changed, and a summary (--per-tensor for every table)."""
    from . import render

    changed = [r for r in reports if r["clipped_tensors"]]
    r0 = reports[0]
    outputs = list(dict.fromkeys(r["output"] for r in reports))
    # one history file, else the directory the outputs went to (not the first step's file)
    dest = outputs[0] if len(outputs) == 1 else os.path.commonpath(outputs) + os.sep
    render.print_table(f"{len(changed)} of {len(reports)} steps clipped ({r0['mode']}, max {render.human(r0['max'])})"
                       + (f" -> {dest}" if r0["output"] else " (dry run, nothing written)"),
                       ["step", "global norm before", "after", "scale", "tensors clipped", "elements changed"],
                       ([r["step"], r["global_norm_before"], r["global_norm_after"], r["scale"], r["clipped_tensors"],
                         r["clipped_elements"]] for r in changed),
                       right=["step", "global norm before", "after", "scale", "tensors clipped", "elements changed"],
                       out=out)


def _clip_sharded(refs: list[Any], output: str | None, spec: Any, force: bool, dry_run: bool,
                  makedirs: Callable[[str], None], durable: bool = True) -> list[dict[str, Any]]:
    """Each sharded step: the norms of its logical tensors over every shard, then each shard clipped by
    the same factors and written next to its own layout (OUT/STEPDIR/SHARDFILE)."""
    from ..clip_dump import clip_dump, shared_norms
    from ..errors import UsageError
    from ..io.atomic import atomic_output, check_output_path
    from ..io.detect import output_format
    from ..io.dump import make_writer, open_dump

    if any(r.shards is None for r in refs):
        raise UsageError("give either sharded steps or one-file dumps, not both")
    if output == "-" or (output is None and not dry_run):
        raise UsageError("sharded steps are written to a directory: give -o DIR (or --dry-run)")
    if output is not None and not dry_run:
        _check_directory_name(output, "a sharded step" if len(refs) == 1 else "more than one sharded step")
    all_inputs = [s for r in refs for s in r.shards]
    plan = []
    for ref in refs:
        for shard in ref.shards:
            target = None
            if output is not None and not dry_run:
                target = os.path.join(output, os.path.basename(os.path.normpath(ref.path)), os.path.basename(shard))
                makedirs(os.path.dirname(target))
                check_output_path(target, force=force, inputs=all_inputs)
            plan.append((ref, shard, target))
    reports = []
    with progress(len(plan), "clip") as advance:
        shared_by_step: dict[str, Any] = {}
        for ref, shard, target in plan:
            if ref.path not in shared_by_step:
                with ref.open() as logical:
                    shared_by_step[ref.path] = shared_norms(logical, spec)
            shared = shared_by_step[ref.path]
            with open_dump(shard) as reader:
                if target is None:
                    res = clip_dump(reader, None, spec, step=ref.step, shared=shared)
                else:
                    with atomic_output(target, force=force, inputs=all_inputs, durable=durable) as tmp:
                        with make_writer(tmp, output_format(target, reader.format), reader.metadata_outside_members(),
                                         compress=bool(getattr(reader, "compressed", False))) as writer:
                            res = clip_dump(reader, writer, spec, step=ref.step, shared=shared)
            reports.append(_record(res, target))
            advance(1)
    return reports
