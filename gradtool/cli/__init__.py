"""Command-line interface: one module per command, one renderer, ``main()`` maps errors to exit codes."""
