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
Run `gradtool COMMAND --help` for a command's options and examples."""


class LazyGroup(click.Group):
    """Imports a command's module only when that command runs (keeps `--help` and start-up fast)."""

    commands_by_module = {
        "stats": ("gradtool.cli.stats", "stats_command"),
        "clip": ("gradtool.cli.clip", "clip_command"),
        "suggest-threshold": ("gradtool.cli.suggest", "suggest_command"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands_by_module)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands_by_module:
            return None
        from importlib import import_module

        module, attr = self.commands_by_module[name]
        return getattr(import_module(module), attr)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                           list[str]]:
        """click's, with git's hint for a mistyped command: ``gradtool stat`` -> "Did you mean 'stats'?"."""
        name = args[0] if args else ""
        known = name in self.commands_by_module
        if name and not name.startswith("-") and not known and not ctx.resilient_parsing:  # not while completing
            from difflib import get_close_matches

            close = get_close_matches(name, self.commands_by_module, n=1, cutoff=0.6)
            close = close or [c for c in self.commands_by_module if c.startswith(name)][:1]
            if close:
                ctx.fail(f"No such command {name!r}. Did you mean {close[0]!r}?")
        return super().resolve_command(ctx, args)


def _version_message() -> str:
    """`gradtool --version`: the version, whether the optional compiled kernel was built and which SIMD
    build of it this CPU runs (AVX-512, AVX2 or 128-bit: a question worth asking when stats are slow), and
    which of the ``[speedups]`` libraries are installed (module look-ups and the kernel's own import, a
    few hundred microseconds without NumPy: --version stays as fast as --help)."""
    from importlib.util import find_spec

    kernel = "not built, NumPy passes instead"
    if find_spec("gradtool.core._kernels") is not None:
        try:
            from ..core._kernels import SIMD

            kernel = f"built, {SIMD}"
        except ImportError as exc:  # e.g. built for another Python
            kernel = f"built but does not load ({exc}), NumPy passes instead"
        if os.environ.get("GRADTOOL_NO_KERNELS"):
            kernel += ", turned off by GRADTOOL_NO_KERNELS"
    speedups = [name for name, module in (("msgspec", "msgspec"), ("python-isal", "isal")) if find_spec(module)]
    return ("%(prog)s, version %(version)s (compiled stats kernel: " + kernel
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


def main(argv: list[str] | None = None) -> None:
    """Console entry point."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        cli.main(args=argv, prog_name="gradtool", standalone_mode=False)
        code = 0
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
    except BrokenPipeError:
        code = 0
    except MemoryError:
        _error("out of memory")
        code = ExitCode.INPUT
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        # `gradtool stats x.npz | head -1`: the reader left; do not print a traceback on exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(code)
