"""Pure numeric functions: norms, clipping and per-tensor statistics. No I/O, no CLI."""
