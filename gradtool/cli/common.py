"""Options and helpers shared by every command."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from .render import FORMATS


def format_option(*, extra: Sequence[str] = (), default: str = "table") -> Callable:
    choices = list(FORMATS) + list(extra)
    return click.option("--format", "fmt", type=click.Choice(choices), default=default, show_default=True,
                        help="Output format: table for people; json, jsonl, csv, tsv for pipelines.")


def backend_option(f: Callable) -> Callable:
    return click.option("--backend", type=click.Choice(["numpy", "cupy", "auto"]), default=None,
                        envvar="GRADTOOL_BACKEND", show_envvar=True,
                        help="Array backend for the arithmetic (default numpy; auto = cupy if a GPU is there).")(f)


def select_options(f: Callable) -> Callable:
    f = click.option("--exclude", "exclude", multiple=True, metavar="GLOB",
                     help="Skip tensors whose name matches GLOB (repeatable).")(f)
    return click.option("--select", "select", multiple=True, metavar="GLOB",
                        help="Only tensors whose name matches GLOB (repeatable; shell-style * ? [..]).")(f)


def norm_type_option(f: Callable) -> Callable:
    return click.option("--norm-type", type=click.Choice(["2", "1", "inf"]), default="2", show_default=True,
                        help="Norm: 2 (Euclidean), 1 (sum |g|) or inf (max |g|).")(f)


def message(text: str) -> None:
    """A message for the user, on stderr."""
    click.echo(text, err=True)


def warning(text: str) -> None:
    """``gradtool: warning: TEXT`` on stderr."""
    message(f"gradtool: warning: {text}")


def skip_unreadable_option(f: Callable) -> Callable:
    return click.option("--skip-unreadable", is_flag=True,
                        help="Leave out dumps that cannot be read (cut short, still being written by a "
                             "running job, malformed), with a warning naming each, instead of stopping at "
                             "the first; an error only when none can be read.")(f)


class SkippedDumps(list):
    """The dumps left out under ``--skip-unreadable``, as ``{"dump": label, "error": why}``; called as the
    ``on_unreadable`` of the readers (:func:`~gradtool.io.history.expand_inputs`), it warns on stderr."""

    def __call__(self, label: str, exc: Any) -> None:
        why = exc.message
        for prefix in (label, label.split("::")[0]):  # the message names the file already
            if why.startswith(prefix + ": "):
                why = why[len(prefix) + 2:]
                break
        self.append({"dump": label, "error": why})
        warning(f"skipped {label}: {why}")


@contextmanager
def progress(total: int, description: str) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr, shown only when stderr is a terminal; yields ``advance(n)``."""
    if not sys.stderr.isatty() or total <= 1:
        yield lambda n=1: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .render import rich_console

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=rich_console(sys.stderr, None), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


@contextmanager
def status(description: str) -> Iterator[None]:
    """A rich spinner saying ``description`` on stderr while a step of unknown length runs (reading a
    training log: a 10^6-line text log takes seconds), shown only when stderr is a terminal, gone after."""
    if not sys.stderr.isatty():
        yield
        return
    from .render import rich_console

    with rich_console(sys.stderr, None).status(description, spinner="dots"):
        yield


@contextmanager
def spooled_inputs(inputs: Sequence[str], *, dumps_only: bool = True) -> Iterator[dict[str, str]]:
    """For the length of a command: every read-once input (``-`` for standard input, a named pipe, a
    shell's ``<(cmd)``) copied once to a temporary file that every later open of it reads; yields
    {input: copy}. A stream can be read only once, and a command looks at a dump more than once: its
    format, its steps, two passes of global-norm clipping. The copies are removed when the command ends.
    ``dumps_only`` (stats, clip) refuses a stream that does not start like a dump before copying it all."""
    from ..io.dump import is_stream

    if not any(is_stream(p) for p in inputs):
        yield {}
        return
    from ..errors import InputError, UsageError
    from ..io.dump import stream_name, streams_spooled

    if list(inputs).count("-") > 1:
        raise UsageError("standard input (-) can be given only once")
    if "-" in inputs and sys.stdin is None:
        raise UsageError("- reads standard input, which is closed: pipe a dump or a log in "
                         "(cmd | gradtool ... -)")
    if "-" in inputs and sys.stdin.isatty():
        raise UsageError("- reads standard input, which is a terminal: pipe a dump or a log in "
                         "(cmd | gradtool ... -)")
    with streams_spooled(inputs, dumps_only=dumps_only) as copies:
        import os

        for p, copy in copies.items():
            if os.path.getsize(copy) == 0:
                raise InputError(f"{stream_name(p)}: empty (nothing was piped in)")
        yield copies


def check_selection(refs: Sequence[Any], select: Sequence[str], exclude: Sequence[str]) -> None:
    """A usage error when ``--select``/``--exclude`` leave no tensor in any of the dumps ``refs``: a mistyped
    glob would otherwise read as a model whose gradients are all zero (``global norm 0``, "zero norms
    at every step"), or a clip that changes nothing. Reads dump indexes until one has a selected tensor:
    one, in the usual case."""
    if not (select or exclude) or not refs:
        return
    from ..errors import UsageError, listed
    from ..summarize import name_selected

    ref, sample = first_dump_with(refs, lambda n: name_selected(n, select, exclude))
    if ref is not None:
        _warn_unmatched_excludes(exclude, [n for n in sample if name_selected(n, select)], ref.label,
                                 len(refs) > 1)
        return
    from ..io.base import METADATA_SCALARS

    flags = " ".join([f"--select '{g}'" for g in select] + [f"--exclude '{g}'" for g in exclude])
    hint = (f"; tensor names there look like: {listed(sample, 4)}" if sample
            else f"; {'it holds' if len(refs) == 1 else 'they hold'} no tensors at all")
    if meta := [g for g in select if g in METADATA_SCALARS]:  # --select loss
        hint += f" (a scalar named {' or '.join(map(repr, meta))} is the dump's metadata, not a tensor)"
    raise UsageError(f"{flags} leaves no tensor in {dumps_phrase(refs)}{hint}")


def _warn_unmatched_excludes(exclude: Sequence[str], names: Sequence[str], label: str, first: bool) -> None:
    """A warning for each ``--exclude`` glob that matches none of ``names`` (dump ``label``'s, those
    ``--select`` kept): a mistyped exclusion leaves in the tensors it was to leave out, silently."""
    import fnmatch

    for g in exclude:
        if not any(fnmatch.fnmatchcase(n, g) for n in names):
            warning(f"--exclude '{g}' matches no tensor of {label}{' (the first dump)' if first else ''}; "
                    "nothing is left out by it")


def first_dump_with(refs: Sequence[Any], wanted: Callable[[str], bool]) -> tuple[Any, list[str]]:
    """(the first dump of ``refs`` with a tensor name that is ``wanted``, its names), reading dump indexes
    in order (one, in the usual case); else (None, the names of the first dump that has any, for an
    error's hint, or [] when none has)."""
    from ..io.history import open_each

    sample: list[str] = []
    for ref, reader in open_each(refs):
        names = reader.names
        if any(wanted(n) for n in names):
            return ref, names
        sample = sample or names
    return None, sample


def names_if_none_match(refs: Sequence[Any], wanted: Callable[[str], bool]) -> list[str] | None:
    """None as soon as a dump of ``refs`` has a tensor name that is ``wanted``; else the names of the
    first dump that has any (for an error's hint), or [] when none has."""
    ref, sample = first_dump_with(refs, wanted)
    return None if ref is not None else sample


def dumps_phrase(refs: Sequence[Any]) -> str:
    """How an error names the dumps it looked in: the one dump's label, or "any of the N dumps"."""
    return refs[0].label if len(refs) == 1 else f"any of the {len(refs)} dumps"


def warn_unmatched_selects(select: Sequence[str], kept: Iterable[str], what: str = "tensor") -> None:
    """A warning on stderr for each of several ``--select`` globs that matched none of ``kept`` (the names
    the whole selection kept, over every dump): while another glob matches, a mistyped one would pass
    unnoticed. (A selection that keeps nothing is refused before: :func:`check_selection`.)"""
    if len(select) < 2:
        return
    import fnmatch

    kept = set(kept)
    for g in select:
        if not any(fnmatch.fnmatchcase(n, g) for n in kept):
            warning(f"--select '{g}' matched no {what}")


def xp_for(backend: str | None) -> Any:
    """The namespace for --backend; None means NumPy on the host (the streaming fast path, and no
    array-api-compat import at start-up)."""
    import os

    name = (backend or os.environ.get("GRADTOOL_BACKEND") or "numpy").strip().lower()
    if name == "numpy":
        return None
    from ..backend import get_namespace

    xp = get_namespace(name)
    from ..backend import is_numpy_namespace

    return None if is_numpy_namespace(xp) else xp


def sharded_option(f: Callable) -> Callable:
    return click.option("--sharded", is_flag=True,
                        help="Each DIRECTORY argument is one step whose files are shards of it (one per rank). "
                             "A directory of step directories is read this way without the flag.")(f)


def numbered_groups_option(f: Callable) -> Callable:
    return click.option("--numbered-groups-are-steps", "numbered_groups", is_flag=True,
                        help="An HDF5 file whose top-level groups are all named by numbers (100/, 200/, "
                             "as f.create_group(str(step)) writes them) is a history of those steps "
                             "(default: one dump, as nn.Sequential names its layers 0/, 1/, ...).")(f)


def engine_options(f: Callable) -> Callable:
    f = click.option("--scheduler", default=None, envvar="DASK_SCHEDULER_ADDRESS", show_envvar=True, metavar="ADDR",
                     help="With --engine dask: an existing cluster's scheduler, e.g. tcp://host:8786 "
                          "(default: a LocalCluster on this machine's cores).")(f)
    return click.option("--engine", type=click.Choice(["local", "dask"]), default="local", show_default=True,
                        help="Where to compute: this process, or Dask workers (pip install 'gradtool[dask]').")(f)
