"""`python -m gradtool` runs the command line."""

from .cli.main import main

main()
