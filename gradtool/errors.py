"""Domain exceptions and the exit-code table, in one place.

Every error a user can cause is a :class:`GradtoolError` carrying its exit code; the CLI's ``main()`` turns
it into one line on stderr. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import IntEnum
from typing import Any


def listed(items: Iterable[Any], limit: int, show: Callable[[Any], str] = str) -> str:
    """The first ``limit`` of ``items`` for a message, comma-separated, with ", ..." when there are more:
    ``listed(["a", "b", "c"], 2)`` -> ``"a, b, ..."``."""
    items = list(items)
    return ", ".join(map(show, items[:limit])) + (", ..." if len(items) > limit else "")


class ExitCode(IntEnum):
    """gradtool's exit codes (also printed by ``gradtool --help``)."""

    OK = 0
    INPUT = 1  # unreadable, malformed or hostile input; non-finite values under nonfinite="error"; I/O failure
    USAGE = 2  # bad command line or nonsense threshold (click's convention)
    NONFINITE = 3  # `stats --fail-on-nonfinite` found NaN/Inf
    NO_THRESHOLD = 4  # `suggest-threshold` could not recommend a value (too little data, or clipping cannot help)
    INTERRUPTED = 130  # Ctrl-C


EXIT_CODE_TABLE: tuple[tuple[int, str], ...] = (
    (ExitCode.OK, "success"),
    (ExitCode.INPUT, "bad input: unreadable, truncated, malformed or hostile file (--skip-unreadable: none readable); NaN/Inf under --nonfinite error; write failure (stdout closed early too)"),
    (ExitCode.USAGE, "usage error: unknown option, missing argument, nonsense threshold, output exists without --force"),
    (ExitCode.NONFINITE, "stats --fail-on-nonfinite found NaN/Inf values"),
    (ExitCode.NO_THRESHOLD, "suggest-threshold could not recommend a threshold (too little data, or explosions at ordinary norms)"),
    (ExitCode.INTERRUPTED, "interrupted (Ctrl-C); no partial output is left behind"),
)


class GradtoolError(Exception):
    """Base class: a message for the user and the exit code that goes with it."""

    exit_code: int = ExitCode.INPUT

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0])


class UsageError(GradtoolError, ValueError):
    """Arguments that make no sense (threshold <= 0, min > max, axes beyond rank...). Exit 2."""

    exit_code = ExitCode.USAGE


class InputError(GradtoolError):
    """A file that cannot be read as what it claims to be. Exit 1."""

    exit_code = ExitCode.INPUT


class UnsafeInputError(InputError):
    """A file that tries something dangerous (pickled objects, path-escaping names, absurd sizes). Exit 1."""


class OutputError(GradtoolError):
    """An output that cannot or must not be written (exists, is an input, disk full). Exit 1 or 2."""


class NonFiniteError(GradtoolError, ValueError):
    """NaN/Inf values met under the ``nonfinite="error"`` policy. ``where`` names the tensors (or indices)."""

    exit_code = ExitCode.INPUT

    def __init__(self, message: str, where: list | None = None):
        super().__init__(message)
        self.where = list(where or [])


class BackendError(UsageError):
    """The requested array backend is not available (e.g. cupy without a GPU). Exit 2."""


class NoThresholdError(GradtoolError):
    """suggest-threshold could not produce a number. Exit 4."""

    exit_code = ExitCode.NO_THRESHOLD
