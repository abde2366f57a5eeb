"""A W&B run log encoder of our own, independent of gradtool's reader: the LevelDB log format and the
protobuf wire format as wandb's ``datastore.py`` and ``wandb_internal.proto`` define them. Its output
was checked to parse identically with wandb's own protobuf schema. Used by tests/suggest/test_wandb.py
and benchmarks/bench.py."""

from __future__ import annotations

import json
import struct
import zlib

from tests.protobuf_encoder import pb_bytes, pb_int

BLOCK = 32768


def history(num: int, step: int, items: dict) -> bytes:
    """A Record holding a HistoryRecord of ``items`` (key -> value, JSON-encoded as wandb does)."""
    body = b"".join(pb_bytes(1, pb_bytes(1, k.encode()) + pb_bytes(16, json.dumps(v).encode()))
                    for k, v in items.items())
    return pb_int(1, num) + pb_bytes(2, body + pb_bytes(2, pb_int(1, step)))


def run_record(name: str, seconds: int) -> bytes:
    body = pb_bytes(1, b"abc123") + pb_bytes(8, name.encode()) + pb_bytes(17, pb_int(1, seconds))
    return pb_bytes(17, body)


def other_record(size: int) -> bytes:
    """A console-output record (Record.output = 4) of ``size`` bytes: to span blocks."""
    return pb_int(1, 1) + pb_bytes(4, pb_bytes(3, b"x" * size))


def write_log(path, records, version=0):
    """The LevelDB log: a record split over 32 KiB blocks as FIRST/MIDDLE/LAST, zeros where fewer than 7
    bytes are left in a block; crc32 of the data seeded with that of the type byte."""
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, version))
    for data in records:
        first = True
        while True:
            left = BLOCK - len(out) % BLOCK
            if left < 7:
                out += bytes(left)
                continue
            chunk, data = data[:left - 7], data[left - 7:]
            kind = (1 if not data else 2) if first else (4 if not data else 3)
            crc = zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF
            out += struct.pack("<IHB", crc, len(chunk), kind)
            out += chunk
            first = False
            if not data:
                break
    path.write_bytes(bytes(out))
    return path
