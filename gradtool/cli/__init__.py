"""Command-line interface: one module per command, one renderer, ``main()`` maps errors to exit codes."""


def run() -> None:
    """The console entry point: :func:`gradtool.cli.main.main`, imported here so that Ctrl-C during
    start-up (click, NumPy and the command's modules take 0.1-0.3 s to import) ends like Ctrl-C at any
    later moment: one line on stderr and exit code 130, not a KeyboardInterrupt traceback. Nothing is
    written before these imports finish, so there is nothing to clean up. This module imports nothing
    itself, to keep the uncovered window (the interpreter's own start-up) as short as possible."""
    try:
        from .main import main
    except KeyboardInterrupt:
        import sys

        from ..errors import ExitCode

        sys.stderr.write("gradtool: error: interrupted\n")
        raise SystemExit(ExitCode.INTERRUPTED) from None
    main()
