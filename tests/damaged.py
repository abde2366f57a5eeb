"""Damaging a file's bytes for property tests of the log readers: what is read from a damaged file is
either a history no longer than the original's or a one-line error, never a traceback."""

from __future__ import annotations

from gradtool.errors import InputError, UsageError
from gradtool.io.logs import read_norm_log


def read_flipped(tmp_path_factory, data: bytes, flips: list[tuple[int, int]], name: str, most: int) -> None:
    """Set the bytes of ``data`` at ``flips`` (position modulo its length, new value), write it as ``name``
    and read it as a log: a history of at most ``most`` values, or an InputError/UsageError of one line."""
    damaged = bytearray(data)
    for pos, value in flips:
        damaged[pos % len(damaged)] = value
    path = tmp_path_factory.mktemp("db") / name
    path.write_bytes(bytes(damaged))
    try:
        h = read_norm_log(str(path))
    except (InputError, UsageError) as exc:
        assert "\n" not in str(exc)
    else:
        assert len(h.steps) == len(h.norms) <= most
