"""A TensorBoard event-file encoder of our own, independent of gradtool's reader: TFRecord framing
(tensorflow's record_writer: length, masked CRC-32C of it, data, masked CRC-32C of the data) and the
protobuf wire format of tensorboard's event.proto/summary.proto, written field by field so that tests can
also write what protobuf parses but writers do not (fields repeated or out of order, unknown fields).
What it writes is read by tensorboard's own EventAccumulator in tests/suggest/test_tensorboard.py (the
reference of gradtool's reader). Used there and by benchmarks/bench.py."""

from __future__ import annotations

import struct

from tests.protobuf_encoder import pb_bytes, pb_double, pb_float, pb_int


def _table() -> list[int]:
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return out


_TABLE = _table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def scalar_value(tag: str, x: float) -> bytes:
    """A Summary.Value of a simple_value, as SummaryWriter.add_scalar writes it."""
    return pb_bytes(1, pb_bytes(1, tag.encode()) + pb_float(2, x))


def histogram_value(tag: str) -> bytes:
    """A Summary.Value holding a histogram (HistogramProto with min = 0, max = 1)."""
    return pb_bytes(1, pb_bytes(1, tag.encode()) + pb_bytes(5, pb_double(1, 0.0) + pb_double(2, 1.0)))


def event(step: int, body: bytes, wall_time: float = 1.7e9) -> bytes:
    """An Event with ``body`` (its "what" fields, already encoded) after wall_time and step."""
    return pb_double(1, wall_time) + pb_int(2, step) + body


def summary_event(step: int, values: list[bytes], wall_time: float = 1.7e9) -> bytes:
    return event(step, pb_bytes(5, b"".join(values)), wall_time)


def file_version_event(version: str = "brain.Event:2") -> bytes:
    return event(0, pb_bytes(3, version.encode()), 1.7e9)


def session_log_event(step: int, status: int) -> bytes:
    return event(step, pb_bytes(7, pb_int(1, status)))


def record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc32c(length)) + data
            + struct.pack("<I", masked_crc32c(data)))


def write_events(path, events: list[bytes]) -> None:
    with open(path, "wb") as f:
        for e in events:
            f.write(record(e))
