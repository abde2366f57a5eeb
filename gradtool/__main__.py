"""`python -m gradtool` runs the command line."""

from .cli import run

run()
