"""The protobuf wire format, read field by field: what the W&B run-log and TensorBoard event readers
need of it (no protobuf import). A message is a sequence of fields, each a varint tag (field number << 3
| wire type) and a value: a varint (wire type 0), 8 or 4 bytes (1, 5), or a varint length and that many
bytes (2: strings, bytes, embedded messages, packed repeated fields). Groups (3, 4) are refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5  # wire types


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """(value, where the next byte is) of the varint at ``buf[i]``; one and two bytes without a loop."""
    if i + 1 < len(buf):
        b = buf[i]
        if b < 0x80:
            return b, i + 1
        c = buf[i + 1]
        if c < 0x80:
            return (b & 0x7F) | c << 7, i + 2
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def proto_fields(buf: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, value) of a protobuf message: an int for varints, bytes for length-delimited
    fields; fixed-width fields as their raw bytes. ValueError on malformed data."""
    i, n = 0, len(buf)
    while i < n:
        t, v, i = _tag_at(buf, i, n)
        yield t >> 3, v


def _tag_at(buf: bytes, i: int, n: int) -> tuple[int, Any, int]:
    """(tag, value, where the next field starts) of the field at ``i`` of the message ``buf`` (``n``
    bytes): the tag is the field number << 3 | the wire type; the value as :func:`proto_fields` gives it."""
    tag = buf[i]
    if tag < 0x80:
        i += 1
    else:
        tag, i = _varint(buf, i)
    if tag < 8 or tag >= 1 << 32:  # field numbers are 1 to 2^29 - 1: protobuf refuses others
        raise ValueError(f"field number {tag >> 3}")
    wire = tag & 7
    if wire == LENGTH_DELIMITED:
        if i >= n:
            raise ValueError("truncated field")
        length = buf[i]
        if length < 0x80:
            i += 1
        else:
            length, i = _varint(buf, i)
        if i + length > n:
            raise ValueError("truncated field")
        return tag, buf[i:i + length], i + length
    if wire == VARINT:
        value, i = _varint(buf, i)
        return tag, value, i
    if wire in (FIXED64, FIXED32):
        width = 8 if wire == FIXED64 else 4
        if i + width > n:
            raise ValueError("truncated field")
        return tag, buf[i:i + width], i + width
    raise ValueError(f"wire type {wire}")
