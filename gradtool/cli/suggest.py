"""`gradtool suggest-threshold`: recommend a max value per clipping mode from a norm history."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import click

from .common import (SkippedDumps, backend_option, engine_options, message, progress, select_options,
                     numbered_groups_option, sharded_option, skip_unreadable_option, spooled_inputs, status)

MODES = ("global-norm", "norm", "average-norm", "value")

EXAMPLES = """
\b
Examples:
  gradtool suggest-threshold run.h5                          # every mode, from gradient dumps
  gradtool suggest-threshold output/trainer_state.json       # Hugging Face log: global-norm only
  gradtool suggest-threshold output/                         # a run dir of checkpoint-*/trainer_state.json
  gradtool suggest-threshold metrics.csv --key grad_2.0_norm_total --current 1.0
  kubectl logs trainer-0 | gradtool suggest-threshold -      # a log (or a dump) on standard input
  gradtool suggest-threshold lightning_logs/version_0/       # TensorBoard logs
  gradtool suggest-threshold logs/                           # Keras' (TensorFlow 2): the run with a norm
  gradtool suggest-threshold mlflow.db --run latest          # MLflow's store (mlruns/ too)
  gradtool suggest-threshold wandb/latest-run/               # a W&B run's local log
  gradtool suggest-threshold ~/.cache/huggingface/trackio/my-project.db --run latest   # Trackio
  gradtool clip run.h5 -o clipped.h5 --mode global-norm \\
      --max "$(gradtool suggest-threshold run.h5 --mode global-norm --format value)"
  gradtool suggest-threshold dumps/ --per-tensor -o thresholds.json
  gradtool clip dumps/ -o clipped/ --mode norm --thresholds thresholds.json

\b
Inputs: gradient dumps (files, directories, multi-step HDF5: every mode can be derived) and/or training
logs (trainer_state.json, CSV/TSV, JSON Lines, Megatron text logs, console output of the Hugging Face
Trainer or fairseq, TensorBoard event files, MLflow's mlflow.db and mlruns/, W&B's
wandb/ run logs, Trackio projects, DVCLive's dvclive/; gzip/bzip2/xz-compressed too); a log given with
dumps adds its loss and learning rate. A store of several runs lists them: choose one with --run (MLflow,
Trackio and TensorBoard runs: among those with a gradient norm). Logs carry only the global norm, so
per-tensor modes cannot be derived from them, unless they log each parameter's norm (Lightning's
grad_norm: grad_2.0_norm/NAME gives norm, grad_inf_norm/NAME value).

\b
Default method (robust): skip the warm-up, leave out everything after a divergence, take a recent
window, then tau = exp(median(log x) + 3.5 * 1.4826 * MAD(log x)), kept within [max(median, 0.5*mean),
10*mean] and below the norm that led into a divergence. Exit code 4 when no threshold can be given.
"""


def _split_inputs(inputs: list[str], sharded: bool = False, copies: dict[str, str] | None = None
                  ) -> tuple[list[str], list[str]]:
    """(dump inputs, log inputs), by content; a read-once input (``-``, a pipe) by that of its copy in
    ``copies`` (:func:`~gradtool.cli.common.spooled_inputs`)."""
    from ..io.detect import detect_format
    from ..io.history import _dir_files, _step_dirs, is_group_address
    from ..io.mlflow_store import is_run_directory
    from ..io.wandb_log import is_run_store

    dumps, logs = [], []
    for p in inputs:
        if copies and p in copies:
            (dumps if detect_format(copies[p]) else logs).append(p)
        elif p == "-":
            dumps.append(p)
        elif os.path.isdir(p):  # an MLflow or W&B run may hold a model file: not a step of dumps
            is_dumps = sharded or (not is_run_directory(p) and not is_run_store(p)
                                   and (_dir_files(p) or _step_dirs(p)))
            (dumps if is_dumps else logs).append(p)
        elif is_group_address(p):  # run.h5::step_100
            dumps.append(p)
        elif not os.path.exists(p):
            from ..errors import InputError

            raise InputError(f"{p}: no such file or directory")
        else:
            (dumps if detect_format(p) else logs).append(p)
    return dumps, logs


def _run_unused(run: str) -> Exception:
    """The usage error for a ``--run`` that no input could use."""
    from ..errors import UsageError

    return UsageError(f"--run {run}: no input is a store of runs (an MLflow store, a Trackio project, W&B's "
                      "wandb/, a directory of TensorBoard runs, a W&B export of several)")


def _merge_logs(paths: list[str], key: str | None, run: str | None = None) -> tuple[Any, list[Any]]:
    """(the logs at ``paths`` as one history, merged by step, the later log winning; each log's own).
    ``run`` chooses a run in stores of several (MLflow, W&B, TensorBoard); it must have been used."""
    from ..io.dump import spooled_copy, stream_name
    from ..io.logs import NormHistory, read_norm_log

    hists = []
    for p in paths:
        with status(f"reading {stream_name(p)}"):
            hists.append(read_norm_log(spooled_copy(p) or p, key, source=stream_name(p), run=run))
    if run is not None and not any(h.run for h in hists):
        raise _run_unused(run)
    if len(hists) == 1:
        return hists[0], hists
    by: dict[int, tuple] = {}
    for h in hists:
        for s, v, lo, lr in zip(h.steps, h.norms, h.loss, h.lr):
            by[s] = (v, lo, lr)
    steps = sorted(by)
    return NormHistory(steps, [by[s][0] for s in steps], [by[s][1] for s in steps], [by[s][2] for s in steps],
                       ", ".join(paths), hists[0].key, hists[0].kind), hists


@click.command("suggest-threshold", epilog=EXAMPLES, short_help="Recommend a clipping threshold from a norm history.")
@click.argument("inputs", nargs=-1, required=True, metavar="HISTORY...")
@click.option("--mode", "modes", type=click.Choice(list(MODES) + ["all"]), multiple=True,
              help="Clipping mode(s) to recommend for (repeatable; default: all the input allows).")
@click.option("--method", type=click.Choice(["robust", "percentile", "zscore", "pascanu"]), default="robust",
              show_default=True, help="robust log-space tail (default), AutoClip percentile, ZClip-like z-score, "
              "or Pascanu's multiple of the mean.")
@click.option("--percentile", type=float, default=99.0, show_default=True, help="percentile method: P.")
@click.option("--k", type=float, default=3.5, show_default=True, help="robust method: MADs above the median (log space).")
@click.option("--z", type=float, default=2.5, show_default=True, help="zscore method: z threshold.")
@click.option("--factor", type=float, default=5.0, show_default=True, help="pascanu method: multiple of the mean.")
@click.option("--burn-in", type=click.IntRange(min=0), default=None, help="Observations to skip at the start (default automatic).")
@click.option("--window", type=click.IntRange(min=8), default=None, help="Observations in the recent window (default automatic).")
@click.option("--current", type=float, default=None, metavar="X", help="Your present threshold: report how often it clips.")
@click.option("--key", default=None, help="Log column/key that holds the gradient norm (default: found automatically).")
@click.option("--run", default=None, metavar="NAME|ID|latest",
              help="Which run of an MLflow store, a Trackio project, W&B's wandb/, a directory of "
                   "TensorBoard runs or a W&B CSV export of several (default: the only one).")
@select_options
@click.option("--format", "fmt", type=click.Choice(["table", "json", "value"]), default="table", show_default=True,
              help="table for people, json for pipelines, value = just the number (needs one mode).")
@click.option("--per-tensor", is_flag=True, help="With -o: write per-tensor thresholds for the per-tensor modes (JSON).")
@click.option("-o", "--output", default=None, metavar="FILE", help="Where --per-tensor writes its thresholds.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="Save a chart (needs gradtool[plot]).")
@click.option("--force", is_flag=True, help="Replace an existing -o / --plot file.")
@sharded_option
@numbered_groups_option
@skip_unreadable_option
@engine_options
@backend_option
def suggest_command(inputs: tuple[str, ...], modes: tuple[str, ...], method: str, percentile: float, k: float,
                    z: float, factor: float, burn_in: int | None, window: int | None, current: float | None,
                    key: str | None, run: str | None, select: tuple[str, ...], exclude: tuple[str, ...],
                    fmt: str, per_tensor: bool,
                    output: str | None, plot_path: str | None, force: bool, sharded: bool,
                    skip_unreadable: bool, engine: str, scheduler: str | None, backend: str | None,
                    numbered_groups: bool = False) -> None:
    """Recommend a clipping threshold per mode from a gradient-norm HISTORY, and show why: clip rates,
    percentile, z-score, ratio to the mean, spikes, non-finite steps, warm-up and divergence."""
    from ..errors import ExitCode, GradtoolError, UsageError
    from ..suggest import SuggestConfig

    cfg = SuggestConfig(method=method, k=k, percentile=percentile, z=z, factor=factor, burn_in=burn_in,
                        window=window, current=current).validate()
    wanted = list(MODES) if not modes or "all" in modes else list(dict.fromkeys(modes))
    explicit_modes = bool(modes) and "all" not in modes
    if per_tensor and not output:
        raise UsageError("--per-tensor writes a file: give it with -o FILE")
    if output and not per_tensor:
        raise UsageError("-o is for --per-tensor thresholds")
    if per_tensor and wanted == ["global-norm"]:  # (said before the history is read, not after)
        raise UsageError("--per-tensor writes the per-tensor modes' thresholds, and --mode global-norm has "
                         "none: add --mode norm (or average-norm, value), or leave --mode out")
    with spooled_inputs(inputs, dumps_only=False) as copies:  # - and pipes: a dump or a log, read once, looked at in the copy
        dump_inputs, log_inputs = _split_inputs(list(inputs), sharded, copies)
        if run is not None and not log_inputs:
            raise _run_unused(run)
        doc = _analyze(dump_inputs, log_inputs, wanted, cfg, key, select, exclude, backend, sharded, engine,
                       scheduler, run, skip_unreadable, numbered_groups)
    if explicit_modes:
        missing = [m for m in wanted if m in doc["cannot_derive"]]
        if missing and not any(m["mode"] in wanted for m in doc["modes"]):
            raise UsageError(f"cannot derive {', '.join(missing)} from this input: {doc['cannot_derive'][missing[0]]}")
    wrote = _write_thresholds(doc, output, force, list(inputs)) if per_tensor else True
    if plot_path:
        from .plot import plot_history

        plot_path_written = plot_history(doc, plot_path, force=force, inputs=list(inputs))
        message(f"wrote {plot_path_written}")
    _render(doc, fmt)
    if not any(m["threshold"] is not None for m in doc["modes"]):
        reasons = "; ".join(f"{m['mode']}: {m['reason']}" for m in doc["modes"]) or "no mode could be derived"
        raise GradtoolError(f"no threshold recommended ({reasons})", exit_code=ExitCode.NO_THRESHOLD)
    if not wrote:
        reasons = "; ".join(f"{m['mode']}: {m['reason']}" for m in doc["modes"] if "per_tensor" in m)
        raise GradtoolError(f"no per-tensor threshold could be derived ({reasons}); {output} was not written",
                            exit_code=ExitCode.NO_THRESHOLD)


def _analyze(dump_inputs: list[str], log_inputs: list[str], wanted: list[str], cfg: Any, key: str | None,
             select: tuple[str, ...], exclude: tuple[str, ...], backend: str | None,
             sharded: bool = False, engine: str = "local", scheduler: str | None = None,
             run: str | None = None, skip_unreadable: bool = False,
             numbered_groups: bool = False) -> dict[str, Any]:
    import numpy as np

    from ..suggest import analyze_history, suggest_per_tensor, suggest_threshold

    cannot: dict[str, str] = {}
    per_tensor_series: dict[str, dict[str, Any]] = {}  # mode -> tensor name -> its series
    per_tensor_tables: dict[str, dict[str, float | None]] = {}
    results: list[dict[str, Any]] = []
    logs_read: list[Any] = []
    skipped = SkippedDumps()
    if dump_inputs:
        from ..io.history import expand_inputs, no_readable_dump
        from ..summarize import dump_history
        from .common import check_selection, warn_unmatched_selects, warning, xp_for

        on_unreadable = skipped if skip_unreadable else None
        # steps from metadata when each dump is read (not in an extra pass: a 20,000-tensor file's index
        # is 0.15-0.3 s)
        refs = expand_inputs(dump_inputs, sharded=sharded, resolve_steps=False, on_warning=warning,
                             on_unreadable=on_unreadable, numbered_groups_are_steps=numbered_groups)
        check_selection(refs, select, exclude)
        with progress(len(refs), "reading dumps") as advance:
            h = dump_history(refs, select=select, exclude=exclude, xp=xp_for(backend), on_dump=advance,
                             engine=engine, scheduler=scheduler, on_unreadable=on_unreadable)
        if not h.steps:
            raise no_readable_dump(dump_inputs, len(skipped))
        steps, norms, loss, lr = h.steps, h.global_norms, h.loss, h.lr
        per_tensor_series = {"norm": h.tensor_norms, "average-norm": h.tensor_norms,
                             "value": h.tensor_max_abs}
        warn_unmatched_selects(select, h.tensor_sizes, "floating-point tensor")
        if log_inputs:  # a log given with dumps adds its loss and learning rate, matched by step
            log, logs_read = _merge_logs(log_inputs, key, run)
            lmap = dict(zip(log.steps, zip(log.loss, log.lr)))
            loss = [lmap.get(s, (lo, None))[0] if lo is None else lo for s, lo in zip(steps, loss)]
            lr = [lmap.get(s, (None, r))[1] if r is None else r for s, r in zip(steps, lr)]
        source = {"kind": "dumps", "inputs": dump_inputs + log_inputs, "key": "global L2 norm"}
        columns = (steps, norms, loss, lr)
        history = None
    else:
        history, logs_read = _merge_logs(log_inputs, key, run)
        # the analysis computes on the arrays; a log read with NumPy has no lists until a chart asks
        columns = steps, norms, loss, lr = history.arrays()
        source = {"kind": history.kind, "inputs": log_inputs, "key": history.key}
        h = None
        per_tensor_series = _logged_tensor_norms(history, select, exclude)
        for m in ("norm", "average-norm", "value"):
            if m not in per_tensor_series:
                cannot[m] = _why_not_from_log(m, history, logs_read)
    from ..errors import InputError, listed

    runs = [{"input": log.source, "id": log.run.id, "name": log.run.name} for log in logs_read if log.run]
    if len(runs) == 1:
        source["run"] = {"id": runs[0]["id"], "name": runs[0]["name"]}
    elif runs:
        source["runs"] = runs
    if len(steps) == 0:
        raise InputError(f"{', '.join(source['inputs'])}: no gradient-norm values found")
    if not np.isfinite(np.asarray(norms, dtype=np.float64)).any():
        raise InputError(f"{', '.join(source['inputs'])}: every one of the {len(norms)} gradient-norm values is "
                         "NaN/Inf: the run was broken from the start; there is nothing to recommend from")
    facts = analyze_history(*columns, burn_in=cfg.burn_in, window=cfg.window)
    g = suggest_threshold(*columns, config=cfg, facts=facts)
    if "global-norm" in wanted:
        results.append(_mode_record("global-norm", g))
    if per_tensor_series:
        cap = g.threshold
        for mode in ("norm", "average-norm", "value"):
            if mode not in wanted or mode not in per_tensor_series:
                continue
            series = per_tensor_series[mode]
            divisors = h.tensor_sizes if mode == "average-norm" and h is not None else None
            cap_m = cap if mode in ("norm", "value") else None
            s, per = suggest_per_tensor(steps, series, facts, cfg, divisors=divisors, cap=cap_m)
            rec = _mode_record(mode, s)
            rec["per_tensor"] = per
            per_tensor_tables[mode] = per
            results.append(rec)
    hist = facts.as_dict()
    if h is not None and h.repeated_steps:
        rs = h.repeated_steps
        hist["warnings"].insert(0, f"{len(rs)} step(s) recorded in more than one dump ({listed(rs, 5)}); "
                                   "the dump given last for each is used (a resumed run recorded again?)")
    for log in logs_read:
        hist["warnings"][:0] = log.notes
        if log.other_keys:
            more = log.other_keys
            others = listed(more, 3, repr)
            verb = "holds" if len(more) == 1 else "hold"
            how = ("--run RUN (a W&B export's runs) or --key" if all(" - " in k for k in [log.key, *more])
                   else "--key")
            hist["warnings"].insert(0, f"{log.source}: the norm was taken from {log.key!r}, but {others} "
                                       f"{verb} a gradient norm too (another run?); choose one with {how}")
    if history is not None:  # arrays (the loss masked where not logged)
        has_loss, has_lr = history.has_loss, history.has_lr
    else:  # lists; list.count: no Python per step
        has_loss, has_lr = loss.count(None) != len(loss), lr.count(None) != len(lr)
    series = {"steps": steps, "global_norm": norms, "loss": loss if has_loss else None,  # read only
              "line_order": history is not None and any(log.line_order for log in logs_read)}
    hist.update({"first_step": int(steps[0]), "last_step": int(steps[-1]), "has_loss": has_loss, "has_lr": has_lr})
    if skipped:
        hist["warnings"].insert(0, f"{len(skipped)} unreadable dump(s) left out (--skip-unreadable): "
                                   f"{listed([d['dump'] for d in skipped], 3)}")
    return {"source": source, "method": cfg.method, "history": hist, "modes": results,
            "cannot_derive": {m: r for m, r in cannot.items() if m in wanted}, "series": series,
            "skipped": list(skipped)}


def _logged_tensor_norms(history: Any, select: tuple[str, ...],
                         exclude: tuple[str, ...]) -> dict[str, dict[str, list[float]]]:
    """The per-tensor series a log gives (Lightning's per-parameter norms:
    ``NormHistory.tensor_norm_arrays``), by mode, the tensors chosen by --select/--exclude: ``norm`` from the L2 norms, ``value`` from the max
    |g| (grad_inf_norm). Never ``average-norm``: a log gives no tensor's element count."""
    from ..summarize import name_selected

    out = {}
    for mode, series in (("norm", history.tensor_norm_arrays), ("value", history.tensor_max_abs_arrays)):
        chosen = {n: v for n, v in series.items() if name_selected(n, select, exclude)}
        if chosen:
            out[mode] = chosen
    return out


def _why_not_from_log(mode: str, history: Any, logs_read: list[Any]) -> str:
    """Why a per-tensor ``mode`` cannot be derived from the logs read."""
    if len(logs_read) > 1 and any(log.tensor_norm_arrays or log.tensor_max_abs_arrays for log in logs_read):
        return "per-parameter norms are read from one log at a time; give that log alone"
    if mode == "average-norm" and history.tensor_norm_arrays:
        return ("a log's per-parameter norms come without the tensors' sizes; average-norm needs gradient "
                "dumps")
    if mode == "value" and history.tensor_norm_arrays:
        return ("the log's per-parameter norms are L2 norms; value needs max |g| (Lightning's "
                "grad_norm(norm_type='inf')) or gradient dumps")
    return "a training log carries only the global norm; per-tensor modes need gradient dumps"


def _mode_record(mode: str, s: Any) -> dict[str, Any]:
    ev = dict(s.evidence)
    return {"mode": mode, "threshold": s.threshold, "method": s.method, "reason": s.reason, **ev}


def _write_thresholds(doc: dict[str, Any], output: str, force: bool, inputs: list[str]) -> bool:
    """Write the per-tensor thresholds of the modes that have any; False (nothing written) when none has:
    an empty table would make a later ``clip --thresholds`` clip nothing."""
    from ..errors import UsageError
    from ..io.atomic import atomic_output

    table = {m["mode"]: {k: v for k, v in m["per_tensor"].items() if v is not None}
             for m in doc["modes"] if "per_tensor" in m}
    if not table:
        raise UsageError("--per-tensor needs per-tensor norms: gradient dumps, or a log of each parameter's "
                         "norm (Lightning's grad_norm); this log carries only the global norm")
    table = {mode: t for mode, t in table.items() if t}
    if not table:
        return False
    from .render import dumps_json

    with atomic_output(output, force=force, inputs=inputs) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(dumps_json({"method": doc["method"], "source": doc["source"], "thresholds": table}) + "\n")
    message(f"wrote per-tensor thresholds for {', '.join(table)} to {output}")
    return True


# ------------------------------------------------------------------------------------------ rendering
def _render(doc: dict[str, Any], fmt: str) -> None:
    from . import render

    if fmt == "value":
        from ..errors import ExitCode, GradtoolError, UsageError

        modes = doc["modes"]
        if len(modes) != 1:
            raise UsageError("--format value prints one number: choose one --mode")
        if modes[0]["threshold"] is None:
            raise GradtoolError(f"no threshold for {modes[0]['mode']}: {modes[0]['reason']}",
                                exit_code=ExitCode.NO_THRESHOLD)
        click.echo(repr(float(modes[0]["threshold"])))
        return
    if fmt == "json":
        out = {k: v for k, v in doc.items() if k != "series"}
        render.write_json(out)
        return
    out = render.console()
    src, hist = doc["source"], doc["history"]
    from ..io.dump import stream_name

    inputs = ", ".join(map(stream_name, src["inputs"]))
    render.print_line(f"history: {hist['n']} observations, steps {hist['first_step']}..{hist['last_step']} "
                      f"from {inputs} ({src['kind']}{_run_of(src)}, key {src['key']}); "
                      f"method {doc['method']}", out)
    g = next((m for m in doc["modes"] if m["mode"] == "global-norm"), None)
    series = doc["series"]["global_norm"]
    # 72 columns of points after a 12-column label; fewer on a narrower terminal, whose lines rich would
    # otherwise fold (80 columns: each row of the chart broken in two)
    for line in ascii_chart(series, g["threshold"] if g else None, width=max(16, min(72, out.width - 12))):
        render.print_line(line, out)
    out.print()
    render.print_table("recommended thresholds",
                       ["mode", "threshold", "clip rate (window)", "clip rate (all)", "percentile", "z-score",
                        "x mean", "spikes above"],
                       ([m["mode"], m["threshold"], _pct(m.get("clip_rate_window")), _pct(m.get("clip_rate_all")),
                         m.get("percentile"), m.get("zscore"), m.get("ratio_to_mean"), len(m.get("spikes", []))]
                        for m in doc["modes"]),
                       right=["threshold", "clip rate (window)", "clip rate (all)", "percentile", "z-score", "x mean",
                              "spikes above"], out=out)
    for line in explain(doc):
        render.print_line(line, out)


def _run_of(source: dict[str, Any]) -> str:
    """", run NAME" for the history line when one run was chosen from a store of runs."""
    run = source.get("run")
    return f", run {run['name']}" if run else ""


def _pct(v: Any) -> str | None:
    return None if v is None else f"{100 * v:.1f}%"


def explain(doc: dict[str, Any]) -> list[str]:
    """The evidence in sentences."""
    from .render import human

    h = doc["history"]
    lines = []
    b = h["burn_in"]
    if b["observations"]:
        lines.append(f"- warm-up skipped: {b['observations']} observations (to step {b['until_step']}): "
                     f"{b['reason']}")
    else:
        lines.append(f"- warm-up skipped: none ({b['reason']})")
    w = h["window"]
    lines.append(f"- window: {w['observations']} observations, steps {w['first_step']}..{w['last_step']}")
    if h["divergence"]:
        d = h["divergence"]
        extra = f", loss {human(d.get('loss_before'))} -> {human(d.get('loss_after'))}" if "loss_before" in d else ""
        lines.append(f"- DIVERGED at step {d['step']} ({d['trigger']}, norm {human(d['norm'])}{extra}); "
                     "the steps after it were left out")
    if h["nonfinite_steps"]:
        lines.append(f"- non-finite norms at {len(h['nonfinite_steps'])} steps: {_list(h['nonfinite_steps'])}")
    if h["nonfinite_loss_steps"]:
        lines.append(f"- non-finite loss at {len(h['nonfinite_loss_steps'])} steps: {_list(h['nonfinite_loss_steps'])}")
    if h["zero_steps"]:
        lines.append(f"- zero norms (frozen or dead) at {len(h['zero_steps'])} steps: {_list(h['zero_steps'])}")
    for warning in h["warnings"]:
        lines.append(f"- note: {warning}")
    for m in doc["modes"]:
        if m["threshold"] is None:
            lines.append(f"- {m['mode']}: NO THRESHOLD: {m['reason']}")
            continue
        spikes = m.get("spikes", [])
        healthy = [s for s in spikes if not s["in_burn_in"] and not s["after_divergence"]]
        if healthy:
            top = sorted(healthy, key=lambda s: -s["norm"])[:5]
            parts = [f"{s['step']} ({human(s['norm'])}" + (f", loss {s['loss_change']:+.3g}" if s["loss_change"] is not None else "")
                     + ")" for s in top]
            lines.append(f"- {m['mode']}: {len(healthy)} healthy-regime steps above it, largest: {', '.join(parts)}")
        if m.get("guard", {}).get("applied"):
            lines.append(f"- {m['mode']}: the {m['guard']['applied']} guard rail set the value "
                         f"(candidate {human(m['candidate'])})")
        if m.get("capped_at_global"):
            lines.append(f"- {m['mode']}: capped at the global-norm threshold")
        if m.get("largest_tensor"):
            lines.append(f"- {m['mode']}: largest per-tensor threshold from {m['largest_tensor']!s}")
        if "current" in m:
            c = m["current"]
            lines.append(f"- {m['mode']}: your current threshold {human(c['threshold'])} clips "
                         f"{_pct(c['clip_rate_window'])} of the window and {_pct(c['clip_rate_all'])} of all steps")
    for mode, why in doc["cannot_derive"].items():
        lines.append(f"- {mode}: cannot be derived: {why}")
    return lines


def _list(steps: list[int], limit: int = 10) -> str:
    shown = ", ".join(str(s) for s in steps[:limit])
    return shown + (f", ... ({len(steps) - limit} more)" if len(steps) > limit else "")


def chart_columns(values: Sequence[float], threshold: float | None, width: int) -> tuple[list[float], float, float] | None:
    """What the chart draws: per column the peak of its bucket of values (NaN when the bucket holds NaN
    or ±inf), and the log10 range from the smallest finite positive value to the largest (or the
    threshold). None when nothing is finite and positive. NumPy reductions: a 10^6-step log in ~10 ms."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    n = v.size
    cols = min(width, n)
    starts = [int(i * n / cols) for i in range(cols)]  # column c shows the peak of values[starts[c]:starts[c+1]]
    with np.errstate(invalid="ignore"):
        peaks = np.maximum.reduceat(v, starts).tolist()  # NaN anywhere in a bucket makes its peak NaN
        bad = np.logical_or.reduceat(np.isinf(v), starts)  # and so does inf (drawn as '!')
        finite = v[np.isfinite(v) & (v > 0)]
    if not finite.size:
        return None
    lo, hi = math.log10(float(finite.min())), math.log10(max(float(finite.max()), threshold or 0.0))
    if hi - lo < 1e-9:
        hi = lo + 1
    return [math.nan if b else p for p, b in zip(peaks, bad.tolist())], lo, hi


def ascii_chart(values: Sequence[float], threshold: float | None, *, height: int = 8, width: int = 72) -> list[str]:
    """A small log-scale chart of a series (a list or an array): '•' points, '─' the threshold, '!'
    non-finite columns."""
    if len(values) == 0:
        return []
    columns = chart_columns(values, threshold, width)
    if columns is None:
        return ["(no finite positive values to chart)"]
    peaks, lo, hi = columns
    cols = len(peaks)

    def row_of(v: float) -> int:
        return min(height - 1, max(0, int((math.log10(v) - lo) / (hi - lo) * (height - 1) + 0.5)))

    grid = [[" "] * cols for _ in range(height)]
    t_row = row_of(threshold) if threshold else None
    if t_row is not None:
        for c in range(cols):
            grid[t_row][c] = "─"
    for c, v in enumerate(peaks):
        if not math.isfinite(v):
            grid[height - 1][c] = "!"
        elif v > 0:
            r = row_of(v)
            if t_row is not None:  # never let a point sit on the line: above means clipped, below means not
                r = max(r, t_row + 1) if v > threshold else min(r, t_row - 1)
                r = min(max(r, 0), height - 1)
            grid[r][c] = "•"
    labels = {height - 1: f"{10 ** hi:.3g}", 0: f"{10 ** lo:.3g}"}
    if t_row is not None:
        labels[t_row] = f"τ {threshold:.3g}"
    lines = [f"{labels.get(r, ''):>10} ┤" + "".join(grid[r]) for r in range(height - 1, -1, -1)]
    return lines
