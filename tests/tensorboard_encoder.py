"""A TensorBoard event-file encoder of our own, independent of gradtool's reader: TFRecord framing
(tensorflow's record_writer: length, masked CRC-32C of it, data, masked CRC-32C of the data) and the
protobuf wire format of tensorboard's event.proto/summary.proto, written field by field so that tests can
also write what protobuf parses but writers do not (fields repeated or out of order, unknown fields).
What it writes is read by tensorboard's own EventAccumulator in tests/suggest/test_tensorboard.py (the
reference of gradtool's reader). Used there and by benchmarks/bench.py."""

from __future__ import annotations

import struct

from tests.protobuf_encoder import pb_bytes, pb_double, pb_float, pb_int, varint


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


# TensorProto's dtype → (struct format of a value, the field TensorBoard's make_ndarray reads values from)
TENSOR_DTYPES = {1: ("<f", 5), 2: ("<d", 6), 3: ("<i", 7), 4: ("<B", 7), 5: ("<h", 7), 6: ("<b", 7),
                 9: ("<q", 10), 14: ("<H", 13), 17: ("<H", 7), 19: ("<e", 13)}


def tensor_proto(dtype: int, values: list, dims: list[int] | None = None, content: bool = False,
                 packed: bool = True) -> bytes:
    """A TensorProto of ``dtype`` (see TENSOR_DTYPES) holding ``values``, as C++'s AsProtoTensorContent
    writes it (``content``: the values' little-endian bytes in ``tensor_content``) or as Python's
    make_tensor_proto and PyTorch's ``new_style`` scalars write it (the dtype's repeated field, ``packed``
    or one field each; half and bfloat16 values given as their 16 bits). ``dims``: the shape's sizes
    (``[]`` or None for a scalar's shape, written or left out)."""
    fmt, field = TENSOR_DTYPES[dtype]
    out = pb_int(1, dtype)
    if dims is not None:
        out += pb_bytes(2, b"".join(pb_bytes(2, pb_int(1, d)) for d in dims))
    if content:
        return out + pb_bytes(4, b"".join(struct.pack(fmt, v) for v in values))
    if field in (5, 6):
        width = 4 if field == 5 else 8
        if packed:
            return out + pb_bytes(field, b"".join(struct.pack(fmt, v) for v in values))
        return out + b"".join((pb_float if width == 4 else pb_double)(field, v) for v in values)
    if dtype == 19:  # half values in half_val as their bits
        values = [struct.unpack("<H", struct.pack("<e", v))[0] for v in values]
    if packed:
        return out + pb_bytes(field, b"".join(varint(v) for v in values))
    return out + b"".join(pb_int(field, v) for v in values)


def plugin_metadata(plugin: str) -> bytes:
    """A SummaryMetadata naming ``plugin`` (its plugin_data's plugin_name)."""
    return pb_bytes(1, pb_bytes(1, plugin.encode()))


def tensor_value(tag: str, tensor: bytes, plugin: str | None = "scalars") -> bytes:
    """A Summary.Value holding the TensorProto ``tensor``, with metadata naming ``plugin`` (none if None),
    as tf.summary.scalar writes a scalar (metadata after the tensor, as TensorFlow 2 writes it)."""
    meta = b"" if plugin is None else pb_bytes(9, plugin_metadata(plugin))
    return pb_bytes(1, pb_bytes(1, tag.encode()) + pb_bytes(8, tensor) + meta)


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
