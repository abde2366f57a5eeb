"""The protobuf wire format written field by field, for the tests' own encoders of W&B run logs
(tests/wandb_encoder.py) and TensorBoard event files (tests/tensorboard_encoder.py): independent of
gradtool's reader (gradtool/io/protowire.py)."""

from __future__ import annotations

import struct


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int64: ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def pb_bytes(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def pb_int(field: int, n: int) -> bytes:
    return varint(field << 3) + varint(n)


def pb_float(field: int, x: float) -> bytes:
    return varint(field << 3 | 5) + struct.pack("<f", x)


def pb_double(field: int, x: float) -> bytes:
    return varint(field << 3 | 1) + struct.pack("<d", x)
