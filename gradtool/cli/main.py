"""The `gradtool` command group and ``main()``, which maps errors to exit codes.

User errors (:class:`GradtoolError`) become one line on stderr, ``gradtool: error: ...``, and their exit
code; click's usage errors exit 2; a closed stdout pipe (``| head``) is quiet; Ctrl-C exits 130.
"""

from __future__ import annotations

import os
import signal
import sys

import click

from .. import __version__
from ..errors import EXIT_CODE_TABLE, ExitCode, GradtoolError

EPILOG = "\b\nExit codes:\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODE_TABLE) + """

\b
Run `gradtool COMMAND --help` (or `gradtool help COMMAND`) for a command's options and examples."""


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs (keeps `--help` and start-up fast)."""

    commands_by_module = {
        "stats": ("gradtool.cli.stats", "stats_command"),
        "clip": ("gradtool.cli.clip", "clip_command"),
        "suggest-threshold": ("gradtool.cli.suggest", "suggest_command"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.commands_by_module, "help"]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "help":
            return help_command
        if name not in self.commands_by_module:
            return None
        from importlib import import_module

        module, attr = self.commands_by_module[name]
        return getattr(import_module(module), attr)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                           list[str]]:
        """click's, with git's hint for a mistyped command: ``gradtool stat`` -> "Did you mean 'stats'?"."""
        name = args[0] if args else ""
        known = name in self.list_commands(ctx)
        if name and not name.startswith("-") and not known and not ctx.resilient_parsing:  # not while completing
            self.fail_unknown(ctx, name)
        return super().resolve_command(ctx, args)

    def fail_unknown(self, ctx: click.Context, name: str) -> None:
        """Usage error for unknown command ``name``, with the closest command when one is close."""
        from difflib import get_close_matches

        names = self.list_commands(ctx)
        close = get_close_matches(name, names, n=1, cutoff=0.6) or [c for c in names if c.startswith(name)][:1]
        if close:
            ctx.fail(f"No such command {name!r}. Did you mean {close[0]!r}?")
        ctx.fail(f"No such command {name!r}.")


def _command_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    return [n for n in LazyGroup.commands_by_module if n.startswith(incomplete)]


@click.command("help", short_help="Show gradtool's help, or a command's.",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("command", required=False, shell_complete=_command_names)
@click.pass_context
def help_command(ctx: click.Context, command: str | None) -> None:
    """Show gradtool's help, or COMMAND's (the same as `gradtool COMMAND --help`).

    \b
    Examples:
      gradtool help
      gradtool help suggest-threshold
    """
    group_ctx = ctx.parent
    assert group_ctx is not None and isinstance(group_ctx.command, LazyGroup)
    if command is None:
        click.echo(group_ctx.get_help())
        return
    cmd = group_ctx.command.get_command(group_ctx, command)
    if cmd is None:
        group_ctx.command.fail_unknown(ctx, command)
        return
    click.echo(cmd.get_help(click.Context(cmd, info_name=command, parent=group_ctx)))


def _version_message() -> str:
    """`gradtool --version`: the version, whether the optional compiled kernel was built and which SIMD
    build of it this CPU runs (AVX-512, AVX2 or 128-bit: a question worth asking when stats are slow),
    whether the compiled log readers were (gradtool/io/_logscan.c) and the npz members' inflater
    (gradtool/io/_inflate_many.c, which needs zlib's header to build), and
    which of the ``[speedups]`` libraries are installed (module look-ups and the kernel's own import, a
    few hundred microseconds without NumPy: --version stays as fast as --help)."""
    from importlib.util import find_spec

    from ..kernel_switch import kernels_turned_off

    off = kernels_turned_off()
    kernel = "not built, NumPy passes instead"
    if find_spec("gradtool.core._kernels") is not None:
        try:
            from ..core._kernels import SIMD

            kernel = f"built, {SIMD}"
        except ImportError as exc:  # e.g. built for another Python
            kernel = f"built but does not load ({exc}), NumPy passes instead"
        if off:
            kernel += ", turned off by GRADTOOL_NO_KERNELS"
    reader = "built" if find_spec("gradtool.io._logscan") is not None else "not built, Python readers instead"
    if off and reader == "built":
        reader += ", turned off by GRADTOOL_NO_KERNELS"
    inflater = "built" if find_spec("gradtool.io._inflate_many") is not None else "not built, a member a call"
    if off and inflater == "built":
        inflater += ", turned off by GRADTOOL_NO_KERNELS"
    speedups = [name for name, module in (("msgspec", "msgspec"), ("python-isal", "isal")) if find_spec(module)]
    return ("%(prog)s, version %(version)s (compiled stats kernel: " + kernel
            + "; compiled log readers (W&B, TensorBoard, MLflow, Trackio, JSON Lines, CSV, text): " + reader
            + "; compiled npz inflater: " + inflater
            + "; speedups: " + (", ".join(speedups) or "none, see pip install 'gradtool[speedups]'") + ")")


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gradtool", message=_version_message())
def cli() -> None:
    """gradtool: gradient diagnostics for saved gradient dumps (.npz, .npy, .h5, .safetensors) and
    training logs. Find where gradient norms spike, pick a clipping threshold from evidence, apply it.

    \b
    Examples:
      gradtool stats run.h5 --sort norm --top 5
      gradtool suggest-threshold run.h5
      gradtool clip run.h5 -o clipped.h5 --mode global-norm --max 3.2
    """


def _error(text: str) -> None:
    try:
        click.echo(f"gradtool: error: {text}", err=True)
    except Exception:
        pass


def _whole_writes_to_stdout() -> None:
    """Under ``python -u`` or ``PYTHONUNBUFFERED=1`` (as many container images set it) ``sys.stdout`` writes
    straight to the raw file, and ``TextIOWrapper`` (and ``shutil.copyfileobj`` on ``sys.stdout.buffer``)
    drop what a write(2) leaves unwritten: an output cut short by a reader that left (``| head``) ended
    with exit 0, its last write's rest lost without a word. A ``BufferedWriter`` over the raw file writes
    all or raises; line buffering keeps the output as prompt as unbuffered."""
    import io

    raw = getattr(sys.stdout, "buffer", None)
    if isinstance(raw, io.RawIOBase):
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=sys.stdout.encoding,
                                      errors=sys.stdout.errors, line_buffering=True)


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")  # OpenBLAS's, in its order


def _one_blas_thread() -> None:
    """Ask OpenBLAS (the BLAS of NumPy's wheels) for no threads of its own, unless the user chose a number
    (:data:`BLAS_THREAD_VARIABLES`), before NumPy is imported (when it reads them). It starts a thread a
    core more at NumPy's import, each spinning through its first ~0.1 s: on two cores that took a core
    from gradtool's own two threads (the statistics, ``clip``'s first pass and its write) during the first
    dump of every run: ``clip`` of the 500 MB GPT-2 set 0.264 -> 0.234 s, ``stats`` 0.163 -> 0.141 s
    (medians in turns). And a float64 chunk's ``np.dot`` on each of gradtool's threads was split across
    BLAS's as well: ``stats`` of 420 MB of float64 0.25-0.6 -> 0.16 s. The command line only; ``import
    gradtool`` leaves a program's BLAS as it is."""
    if "numpy" not in sys.modules and not any(os.environ.get(v) for v in BLAS_THREAD_VARIABLES):
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


GC_FIRST_GENERATION = 10_000  # container objects allocated between collections of the youngest (default 700)


def main(argv: list[str] | None = None) -> None:
    """Console entry point.

    The cyclic garbage collector's youngest generation is collected every GC_FIRST_GENERATION allocations
    instead of 700: a 20,000-tensor dump's index and statistics are ~10^5 objects (headers' dicts, tensor
    infos, statistics), none in a cycle, which the default made the collector scan again and again, the
    older generations with them: 30 % of ``stats`` on a history of such dumps, 15 % of ``suggest-threshold``
    (the garbage a cycle leaves waits for at most that many allocations more)."""
    import gc

    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    _one_blas_thread()
    _whole_writes_to_stdout()
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], GC_FIRST_GENERATION), *thresholds[1:])
    reader_left = False
    stdout, stderr = sys.stdout, sys.stderr
    try:
        cli.main(args=argv, prog_name="gradtool", standalone_mode=False)
        code = 0
    except SystemExit:
        if sys.stdout is stdout:  # (shell completion's exit, say: as it is)
            raise
        # click's own, standalone or not, after a write met EPIPE: sys.exit(1) with stdout and stderr wrapped
        # to ignore EPIPE on flush, not on their close at exit ("Exception ignored ... BrokenPipeError" on
        # Python 3.13 under PYTHONUNBUFFERED=1, every time)
        sys.stdout, sys.stderr = stdout, stderr
        code = ExitCode.INPUT
        reader_left = True
    except GradtoolError as exc:
        _error(exc.message)
        code = int(exc.exit_code)
    except click.exceptions.Abort:
        _error("interrupted")
        code = ExitCode.INTERRUPTED
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except KeyboardInterrupt:
        _error("interrupted")
        code = ExitCode.INTERRUPTED
    except BrokenPipeError:  # the reader left (`| head`): the output is cut, so not a success; no message.
        code = ExitCode.INPUT  # (click itself exits 1 when a command's write meets EPIPE, as Python's docs do)
        reader_left = True
    except MemoryError:
        _error("out of memory")
        code = ExitCode.INPUT
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        reader_left = True
    if reader_left:
        # `gradtool stats x.npz | head -1`: whatever a stream still holds for the pipe goes nowhere, so that
        # the flushes at exit print no "Exception ignored ... BrokenPipeError"
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # (a stdout with no descriptor: main called in-process)
            pass
    gc.set_threshold(*thresholds)  # (main called in-process: the caller's again)
    sys.exit(code)
