"""TensorBoard event files read without tensorboard (gradtool/io/tensorboard_log.py). tensorboard's own
reader (EventAccumulator, the test extra) was the reader: its record reader computes CRC-32C byte by byte
in Python (~30 us an event; 10^5 steps of three scalars took 3-5 s). The reader of our own must keep what
EventAccumulator keeps, purges included: property-tested here against EventAccumulator on event files of
generated events, written by an encoder of this test's own (tests/tensorboard_encoder.py)."""

from __future__ import annotations

import importlib.util
import math
import os
import struct
import sys
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.errors import InputError, UsageError
from gradtool.io import tensorboard_log
from gradtool.io.logs import read_norm_log
from gradtool.io.tensorboard_log import scalar_series
from tests import tensorboard_encoder as enc

_TAGS = ["train/grad_norm", "train/loss", "train/acc1", "lr", "xy", "hist", ""]  # some of one length


def _points(series):
    """scalar_series' arrays as (step, repr(value)) pairs per tag."""
    return {k: [(s, repr(v)) for s, v in zip(steps.tolist(), values.tolist())]
            for k, (steps, values) in series.items()}


def _accumulated(path):
    """What tensorboard's EventAccumulator keeps of the run at ``path``: each scalar tag's (step, value)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


_values = st.one_of(
    st.builds(enc.scalar_value, st.sampled_from(_TAGS), st.floats(width=32)),
    st.builds(enc.histogram_value, st.sampled_from(_TAGS)),
    st.sampled_from([enc.pb_bytes(1, enc.pb_bytes(1, b"train/loss")),  # a value of no kind
                     enc.pb_bytes(1, enc.pb_bytes(1, b"lr") + enc.pb_float(2, 1.5) + enc.pb_bytes(5, b"")),
                     enc.pb_bytes(1, enc.pb_float(2, 2.5) + enc.pb_bytes(1, b"lr")),  # fields out of order
                     enc.pb_bytes(1, enc.pb_bytes(1, b"lr") + enc.pb_bytes(2, b"abcd")),  # wrong wire type
                     enc.pb_bytes(1, enc.pb_bytes(1, b"lr") + enc.pb_float(2, 1.0) + enc.pb_int(99, 7))]))
_steps = st.one_of(st.integers(0, 40), st.integers(-3, 300), st.sampled_from([2**31, 2**62, -2**63]))
_event = st.one_of(
    st.builds(enc.summary_event, _steps, st.lists(_values, max_size=4)),
    st.builds(enc.session_log_event, _steps, st.sampled_from([0, 1, 2, 3])),
    st.sampled_from([enc.file_version_event("brain.Event:2"), enc.file_version_event("brain.Event:1"),
                     enc.file_version_event("brain.Event:x"), enc.event(5, enc.pb_bytes(4, b"graph")),
                     # a summary given twice (merged), a step given twice (the last), a summary then a
                     # session log (the oneof's last member)
                     enc.event(7, enc.pb_bytes(5, enc.scalar_value("lr", 1.0))
                               + enc.pb_bytes(5, enc.scalar_value("lr", 2.0))),
                     enc.event(3, enc.pb_int(2, 9) + enc.pb_bytes(5, enc.scalar_value("train/loss", 4.0))),
                     enc.event(8, enc.pb_bytes(5, enc.scalar_value("lr", 3.0))
                               + enc.pb_bytes(7, enc.pb_int(1, 1))),
                     enc.event(2, b""), b""]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_event, max_size=12), min_size=1, max_size=3), st.booleans(),
       st.sampled_from([1, 13, 100, 8 << 20]))
@example([[enc.file_version_event(), enc.summary_event(5, [enc.scalar_value("lr", 1.0)]),
           enc.summary_event(9, [enc.scalar_value("lr", 2.0)]), enc.session_log_event(6, 1),
           enc.summary_event(6, [enc.scalar_value("lr", 3.0)])]], False, 13)  # the START at 6 drops step 9
@example([[enc.summary_event(5, [enc.scalar_value("lr", 1.0), enc.scalar_value("train/loss", 1.0)]),
           enc.summary_event(9, [enc.scalar_value("lr", 2.0), enc.scalar_value("train/loss", 2.0)]),
           enc.summary_event(7, [enc.scalar_value("lr", 3.0)])]], True, 1)  # no version: lr's 9 dropped
@example([[enc.file_version_event(), enc.summary_event(200, [enc.scalar_value("train/loss", 1.0)]),
           enc.summary_event(70000, [enc.scalar_value("lr", 2.0)]),
           enc.summary_event(2**27, [enc.scalar_value("train/loss", 3.0)])]], False, 8 << 20)  # tags in order
@example([[enc.file_version_event(), enc.summary_event(1, [enc.scalar_value("lr", 1.0)]),
           enc.summary_event(2, [enc.scalar_value("xy", 2.0)]),
           enc.summary_event(3, [enc.scalar_value("lr", 3.0)])]], False, 8 << 20)  # 2 tags of a length
def test_the_scalars_are_what_tensorboards_accumulator_keeps(tmp_path_factory, files, cut_last, window):
    """Scalars of one to three event files of a run directory (read in name order, the purge state
    carried from one to the next), any of these events: summaries of scalar, histogram and kind-less
    values, session logs (START purges with file_version 2), file versions (2, 1, malformed: the
    out-of-order purge), graphs, messages given twice, fields out of order or of another wire type; the
    last record cut off or not; the files read ``window`` bytes at a time (records across windows); the
    scalar records read together (with one or two tags of a length found in a window, the others one by
    one)."""
    pytest.importorskip("tensorboard")
    d = tmp_path_factory.mktemp("run")
    for n, events in enumerate(files):
        p = d / f"events.out.tfevents.{1700000000 + n}.host"
        enc.write_events(p, events)
        if cut_last and n == len(files) - 1 and events:
            p.write_bytes(p.read_bytes()[:-3])
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tensorboard_log, "WINDOW", window)
        m.setattr(tensorboard_log, "_TAGS_COMPARED", 1 + window % 2)  # (records of further tags: one by one)
        ours = scalar_series(str(d))
    assert list(ours) == list(_accumulated(d))
    assert _points(ours) == {k: [(s, repr(v)) for s, v in pts] for k, pts in _accumulated(d).items()}


def test_a_run_read_without_tensorboard(tmp_path, monkeypatch):
    """tensorboard is not imported (it was needed for any event file: `pip install gradtool[tensorboard]`)."""
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard now fails
    p = tmp_path / "events.out.tfevents.1700000000.host"
    enc.write_events(p, [enc.file_version_event()] + [
        enc.summary_event(s, [enc.scalar_value("train/grad_norm", 1 + s / 8),
                              enc.scalar_value("train/loss", 2.0)])
        for s in range(1, 31)])
    h = read_norm_log(str(p))
    assert h.kind == "tensorboard" and h.key == "train/grad_norm" and h.steps == list(range(1, 31))
    assert h.norms == [1 + s / 8 for s in range(1, 31)] and h.loss == [2.0] * 30


def _file_of(tmp_path, n=20):
    p = tmp_path / "events.out.tfevents.1700000000.host"
    enc.write_events(p, [enc.file_version_event()] + [
        enc.summary_event(s, [enc.scalar_value("train/grad_norm", 1.5)]) for s in range(n)])
    return p


@pytest.mark.parametrize("window", [7, 100, 8 << 20])
def test_a_damaged_record_is_an_input_error_naming_its_byte(tmp_path, monkeypatch, window):
    """A flipped bit in a scalar's record (its value, or its length) is found by the record's CRC,
    whichever window of the file holds it."""
    monkeypatch.setattr(tensorboard_log, "WINDOW", window)
    p = _file_of(tmp_path)
    data = bytearray(p.read_bytes())
    first = len(enc.record(enc.file_version_event()))
    size = len(enc.record(enc.summary_event(0, [enc.scalar_value("train/grad_norm", 1.5)])))
    at = first + 3 * size  # the fourth scalar's record
    data[at + size - 6] ^= 0x01  # in its float
    p.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"damaged TensorBoard event file \(bad record at byte {at}\)"):
        read_norm_log(str(p))
    data[at + size - 6] ^= 0x01
    data[at] ^= 0x40  # its length: 64 bytes more
    p.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"bad record length at byte {at}\)"):
        read_norm_log(str(p))
    p.write_bytes(bytes(data[:at + 12]))  # ... and the file ends after it: no cut write, a damaged length
    with pytest.raises(InputError, match=rf"bad record length at byte {at}\)"):
        read_norm_log(str(p))


@pytest.mark.parametrize("window", [7, 8 << 20])
@pytest.mark.parametrize("keep", [0, 5, 12, 20, -4, -1])
def test_a_record_cut_off_at_the_end_ends_the_file(tmp_path, monkeypatch, keep, window):
    """A run still writing (or killed) leaves its last record cut off: the records before it are read."""
    monkeypatch.setattr(tensorboard_log, "WINDOW", window)
    p = _file_of(tmp_path, 10)
    data = p.read_bytes()
    size = len(enc.record(enc.summary_event(0, [enc.scalar_value("train/grad_norm", 1.5)])))
    p.write_bytes(data[:len(data) - size + keep] if keep >= 0 else data[:keep])
    assert _points(scalar_series(str(p)))["train/grad_norm"] == [(s, "1.5") for s in range(9)]


_pieces = st.one_of(st.lists(st.binary(max_size=200), max_size=40),
                    st.builds(lambda first, edits: [bytes(first)] + [
                        bytes(first[:j % len(first)]) + bytes([b]) + bytes(first[j % len(first) + 1:])
                        for j, b in edits],  # pieces of one length that differ from the first in a byte
                              st.binary(min_size=1, max_size=60),
                              st.lists(st.tuples(st.integers(0, 99), st.integers(0, 255)), max_size=30)))


@settings(deadline=None)
@given(_pieces, st.sampled_from([1, 3, 1 << 16]), st.sampled_from([1, 8]))
@example([b"x" * 5000, b"", b"123456789"], 2, 8)  # one longer than _LONG_RECORD; the CRC-32C check value
@example([b"\x00" * 12, b"\x00" * 11 + b"\x01", b"\x01" + b"\x00" * 11], 1 << 16, 1)
def test_the_crcs_of_many_pieces_are_each_ones(pieces, batch, same):
    """The masked CRC-32C of many pieces at once (a byte position at a time across them, shortest first,
    in batches; pieces of one length from the first one's CRC and the bytes where they differ) equals the
    byte-by-byte CRC of each, whatever the lengths and batches."""
    raw = np.frombuffer(b"".join(pieces) or b"\0", np.uint8)
    starts = np.cumsum([0] + [len(p) for p in pieces[:-1]]).astype(np.int64)
    lengths = np.array([len(p) for p in pieces], np.int64)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tensorboard_log, "_CRC_BATCH", batch)
        m.setattr(tensorboard_log, "_SAME_LENGTH_AT_LEAST", same)
        got = tensorboard_log._masked_crc32c(raw, starts, lengths).tolist() if pieces else []
    assert got == [enc.masked_crc32c(p) for p in pieces]
    assert enc.crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C


@settings(deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_are_read_or_an_input_error(tmp_path_factory, tail):
    """A hostile event file: whatever follows a good record is read or refused in one InputError."""
    p = tmp_path_factory.mktemp("tb") / "events.out.tfevents.1.host"
    p.write_bytes(enc.record(enc.file_version_event()) + tail)
    try:
        series = scalar_series(str(p))
    except InputError as exc:
        assert str(exc).startswith(str(p))
    else:
        assert all(s.dtype == np.int64 and v.dtype == np.float64 and s.size == v.size
                   for s, v in series.values())


@settings(deadline=None)
@given(st.binary(max_size=120))
def test_any_event_bytes_in_a_good_record_are_read_or_an_input_error(tmp_path_factory, data):
    """Random Event bytes framed with correct CRCs reach the protobuf reader (random bytes alone fail
    the CRC): read as protobuf reads them (EventAccumulator's scalars), or one InputError where protobuf
    refuses them too, or takes what this reader refuses (groups, a wire type long deprecated)."""
    p = tmp_path_factory.mktemp("tb") / "events.out.tfevents.1.host"
    enc.write_events(p, [enc.file_version_event(), enc.summary_event(1, [enc.scalar_value("lr", 1.0)]), data])
    try:
        ours = scalar_series(str(p))
    except InputError as exc:
        assert str(exc).startswith(str(p))
        ours = None
    if importlib.util.find_spec("tensorboard") is None:
        return
    try:
        theirs = _accumulated(p)
    except Exception:  # protobuf's DecodeError, through EventAccumulator.Reload
        theirs = None
    if ours is not None:
        assert theirs is not None and _points(ours) == \
            {k: [(s, repr(v)) for s, v in pts] for k, pts in theirs.items()}


def test_steps_logged_again_after_a_restart_drop_the_later_ones(tmp_path):
    """Steps logged again after a restart without a session log (file_version 1, TensorFlow before 1.0)
    drop the later steps of the tags they log; the norm's history is then the restarted one."""
    p = tmp_path / "events.out.tfevents.1.host"
    enc.write_events(p, [enc.file_version_event("brain.Event:1")]
                     + [enc.summary_event(s, [enc.scalar_value("grad_norm", 1.0)]) for s in range(1, 11)]
                     + [enc.summary_event(s, [enc.scalar_value("grad_norm", 2.0)]) for s in range(6, 9)])
    h = read_norm_log(str(p))
    assert h.steps == list(range(1, 9)) and h.norms == [1.0] * 5 + [2.0] * 3


def _framed(data):
    """The records' (data start, length) read one by one: the reference of tensorboard_log._framing."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        if pos + 16 + length > len(data):
            break
        out.append((pos + 12, length))
        pos += 16 + length
    return out, pos


@settings(deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 40), min_size=1, max_size=4), st.integers(1, 40)),
                max_size=8), st.binary(max_size=30), st.sampled_from([1, 2, 16]),
       st.sampled_from([1, 3, 1 << 15]))
@example([([5, 9, 7], 40), ([5, 9, 8], 20)], b"", 16, 1 << 15)
@example([([5, 30], 10)], struct.pack("<Q", 5) + bytes(4) + b"x" * 5 + bytes(4)
         + struct.pack("<Q", 30) + bytes(4) + b"y" * 30, 16, 1 << 15)  # the last one's CRC cut off
def test_records_framed_by_guessing_their_lengths_are_those_read_one_by_one(runs, tail, after, at_once):
    """Runs of records whose lengths repeat a short cycle (the same tags step after step), then another
    cycle, then anything (a cut record, garbage): framing that guesses the next lengths from the last ones
    and checks them together finds the records reading them one by one finds."""
    data = b"".join(struct.pack("<Q", n) + bytes(4) + bytes([n % 251]) * n + bytes(4)
                    for cycle, reps in runs for _ in range(reps) for n in cycle) + tail
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tensorboard_log, "_GUESS_AFTER", after)
        m.setattr(tensorboard_log, "_GUESS_RECORDS", at_once)
        starts, lengths, end = tensorboard_log._framing_here(data)
    assert (list(zip(starts, lengths)), end) == _framed(data)


def test_a_guess_of_record_lengths_that_fails_at_once_costs_a_few_records(monkeypatch):
    """Records whose last lengths repeat but whose next do not (tags of one length among others: each
    parameter's norm) are guessed a few at a time, then four times more while all were as guessed: the
    records guessed in all are about those read, not _GUESS_RECORDS each try (42 s for 10^6 events)."""
    lengths = [30] * 20 + [31] + [30] * 17 + [33] * 3  # guesses of period 1 that fail after a few records
    data = b"".join(struct.pack("<Q", n) + bytes(4) + bytes([n]) * n + bytes(4) for n in lengths * 300)
    guessed = []
    resize = np.resize
    monkeypatch.setattr(np, "resize", lambda a, count: guessed.append(count) or resize(a, count))
    starts, lengths_read, end = tensorboard_log._framing_here(data)
    assert (list(zip(starts, lengths_read)), end) == _framed(data)
    assert guessed and sum(guessed) <= 4 * len(starts) and max(guessed) <= tensorboard_log._GUESS_RECORDS


_points_of = st.lists(st.tuples(st.integers(-5, 30), st.floats(width=32)), max_size=25)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(["train/grad_norm", "train/loss", "train/learning_rate", "eval/loss",
                                        "grad_2.0_norm/w", "grad_2.0_norm/v", "grad_inf_norm/w",
                                        "l2_norm/grad/u", "grad_2.0_norm_total"]), _points_of),
       st.sampled_from(["train/grad_norm", "train/loss", "grad_2.0_norm_total"]), st.booleans())
@example({"train/grad_norm": [(3, 1.0), (1, 2.0), (3, 4.0)], "train/loss": [(3, 5.0), (2, 6.0)]},
         "train/grad_norm", False)
@example({"grad_2.0_norm_total": [(3, 1.0), (1, 2.0)], "grad_2.0_norm/w": [(5, 1.0)], "grad_inf_norm/w": [],
          "l2_norm/grad/u": [(2, 7.0)], "train/loss": [(0, 1.0)]}, "grad_2.0_norm_total", True)
@example({"grad_2.0_norm_total": [(1, 1.0), (3, 2.0)], "grad_2.0_norm/v": [(1, 1.0), (3, 1.0)],
          "grad_2.0_norm/w": [(0, 1.0), (1, 1.0), (3, 1.0)]}, "grad_2.0_norm_total", False)  # w comes first
def test_a_history_from_metric_arrays_is_the_one_from_their_pairs(metrics, nkey, aligned):
    """from_metric_arrays (NumPy: each metric's last value per step, loss and learning rate at the norm's
    steps, each parameter's norm at them) gives the history from_metric_series gives from the same (step,
    value) pairs by a dict per step: steps, norms, loss, learning rate, notes, per-parameter norms and
    max |g| (in the same order), whatever the steps (repeated, unsorted, negative; ``aligned``: each
    parameter's those of the norm, as a logger writes them), values (NaN, Inf), metrics missing or empty."""
    from gradtool.io.logs import from_metric_arrays, from_metric_series

    metrics.setdefault(nkey, [])
    if aligned:  # each parameter's norm at the steps of the global norm, its values shuffled
        for k in metrics:
            if "/" in k and k.split("/")[0] in ("grad_2.0_norm", "grad_inf_norm", "l2_norm") and k != nkey:
                values = [v for _, v in metrics[k]] or [0.5]
                metrics[k] = [(s, values[i % len(values)]) for i, (s, _) in enumerate(metrics[nkey])]
    arrays = {k: (np.array([s for s, _ in p], np.int64), np.array([v for _, v in p], np.float64))
              for k, p in metrics.items()}

    def outcome(build):
        try:
            h = build()
        except (InputError, UsageError) as exc:
            return type(exc), str(exc)
        return (h.steps, [repr(v) for v in h.norms], [repr(v) for v in h.loss], [repr(v) for v in h.lr],
                h.key, h.kind, h.line_order, h.other_keys, h.notes,
                [(k, [repr(x) for x in v]) for k, v in h.tensor_norms.items()],
                [(k, [repr(x) for x in v]) for k, v in h.tensor_max_abs.items()])

    fast = outcome(lambda: from_metric_arrays(list(metrics), nkey, arrays.__getitem__, "x", "tensorboard"))
    slow = outcome(lambda: from_metric_series(list(metrics), nkey, lambda k: metrics[k], "x", "tensorboard"))
    assert fast == slow


def test_only_the_records_scalars_come_from_have_their_data_checked(tmp_path):
    """A summary of a histogram alone (images and histograms: up to megabytes each, a CRC computed in
    Python) is not checked: a flipped bit in it leaves the scalars read; one in a summary that holds a
    scalar beside a histogram is an error."""
    p = tmp_path / "events.out.tfevents.1.host"
    big = enc.summary_event(2, [enc.histogram_value("w" * 50_000)])
    mixed = enc.summary_event(3, [enc.histogram_value("w"), enc.scalar_value("train/grad_norm", 3.0)])
    events = [enc.file_version_event(), enc.summary_event(1, [enc.scalar_value("train/grad_norm", 1.0)]), big,
              mixed]
    data = bytearray(b"".join(enc.record(e) for e in events))
    at_big = len(enc.record(events[0])) + len(enc.record(events[1]))
    data[at_big + 12 + 30_000] ^= 0x01  # in the histogram's tag
    p.write_bytes(bytes(data))
    assert _points(scalar_series(str(p)))["train/grad_norm"] == [(1, "1.0"), (3, "3.0")]
    at_mixed = at_big + len(enc.record(big))
    data[at_mixed + 12 + len(mixed) - 3] ^= 0x01  # in the scalar
    p.write_bytes(bytes(data))
    with pytest.raises(InputError, match=rf"bad record at byte {at_mixed}\)"):
        scalar_series(str(p))


@pytest.mark.parametrize("length", [2**62, 2**64 - 1, 10**9])
def test_a_record_longer_than_the_rest_of_the_file_ends_it_unread(tmp_path, length):
    """A length field whose CRC holds (a hostile file's, or a record cut off) but which says more bytes
    than the file has left: the records before it are read, and the rest of the file is not read into
    memory to find the end of it (it was a MemoryError/OverflowError traceback in reading up to it)."""
    p = _file_of(tmp_path, 5)
    head = struct.pack("<Q", length)
    with open(p, "ab") as f:
        f.write(head + struct.pack("<I", enc.masked_crc32c(head)) + b"x" * 100)
    assert _points(scalar_series(str(p)))["train/grad_norm"] == [(s, "1.5") for s in range(5)]


frames = tensorboard_log._compiled_frames()
needs_frames = pytest.mark.skipif(frames is None,
                                  reason="gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")


@needs_frames
@settings(deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=12), st.binary(max_size=30),
       st.lists(st.tuples(st.integers(0, 10**5), st.integers(1, 255)), max_size=3))
@example([b"x" * 5000, b"", b"123456789"], b"", [])
def test_the_compiled_framing_is_the_records_read_one_by_one(pieces, tail, flips):
    """tfrecord_frames: the records reading them one by one finds (a cut one left out), up to the first
    whose length field does not match its CRC, and whether each one's data matches its CRC: the
    reference's CRC-32C (tests/tensorboard_encoder.py), whatever bytes are changed."""
    data = bytearray(b"".join(enc.record(p) for p in pieces) + tail)
    for at, byte in flips:
        if data:
            data[at % len(data)] ^= byte
    data = bytes(data)
    starts, lengths, end, bad, ok = frames(data)
    want, pos = [], 0
    while pos + 16 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        if pos + 16 + length > len(data):
            break
        if enc.masked_crc32c(data[pos:pos + 8]) != struct.unpack_from("<I", data, pos + 8)[0]:
            break
        body = data[pos + 12:pos + 12 + length]
        stored = struct.unpack_from("<I", data, pos + 12 + length)[0]
        want.append((pos + 12, length, enc.masked_crc32c(body) == stored))
        pos += 16 + length
    got = list(zip(np.frombuffer(starts, np.int64).tolist(), np.frombuffer(lengths, np.int64).tolist(),
                   np.frombuffer(ok, np.bool_).tolist()))
    assert (got, end) == (want, pos)
    whole = pos + 16 <= len(data) and pos + 16 + struct.unpack_from("<Q", data, pos)[0] <= len(data)
    assert bad == (pos if whole else -1)


def _series_or_error(path, compiled):
    with pytest.MonkeyPatch.context() as m:
        if not compiled:
            m.setattr(tensorboard_log, "_compiled_frames", lambda: None)
        try:
            return _points(scalar_series(str(path)))
        except InputError as exc:
            return str(exc)


@needs_frames
@settings(max_examples=100, deadline=None)
@given(st.lists(_event, max_size=12),
       st.lists(st.tuples(st.integers(0, 10**4), st.integers(1, 255)), max_size=2),
       st.integers(0, 40), st.sampled_from([13, 100, 8 << 20]))
def test_damaged_event_files_read_the_same_with_the_compiled_framing(tmp_path_factory, events, flips, cut,
                                                                     window):
    """Any events, bytes changed anywhere (lengths, CRCs, data) and the end cut: the compiled framing and
    the NumPy one give the same scalars or the same error, whatever the window."""
    data = bytearray(b"".join(enc.record(e) for e in [enc.file_version_event(), *events]))
    for at, byte in flips:
        data[at % len(data)] ^= byte
    p = tmp_path_factory.mktemp("tb") / "events.out.tfevents.1.host"
    p.write_bytes(bytes(data[:len(data) - cut]))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tensorboard_log, "WINDOW", window)
        assert _series_or_error(p, True) == _series_or_error(p, False)



def _scalar_of_tag(step: int, tag: bytes, x: float) -> bytes:
    """add_scalar's event for a tag given as bytes (not UTF-8, say)."""
    return enc.summary_event(step, [enc.pb_bytes(1, enc.pb_bytes(1, tag) + enc.pb_float(2, x))])


@needs_frames
@pytest.mark.parametrize("tags", [
    [b"\xff\xfe", b"lr", b"\xff\xfe"],  # not UTF-8: read one by one, where the error is said
    [f"t{i}".encode() for i in range(1100)] + [b"t5", b"t1099"],  # more tags than a window's table holds
    [b"", b"a" * 119, b"a" * 120],  # the shortest and the longest tags of the layout, and one beyond it
])
def test_scalar_records_read_the_same_by_the_compiled_reader(tmp_path, tags):
    """The compiled reader's add_scalar records give the scalars (or the error) the NumPy reader gives."""
    p = tmp_path / "events.out.tfevents.1.host"
    enc.write_events(p, [enc.file_version_event()]
                     + [_scalar_of_tag(i, t, 0.5 * i) for i, t in enumerate(tags)])
    compiled, here = _series_or_error(p, True), _series_or_error(p, False)
    assert compiled == here
    if b"\xff\xfe" not in tags:
        assert sum(len(v) for v in compiled.values()) == len(tags)


@needs_frames
def test_the_compiled_reader_finds_add_scalars_records(tmp_path):
    """Every record of add_scalar's layout is found by tfevent_scalars (not left to the one-by-one
    reader), with its step, tag and value; a record of another layout is not."""
    from gradtool.io._logscan import tfevent_scalars

    events = [enc.summary_event(s, [enc.scalar_value("train/loss", s / 4)]) for s in (0, 127, 128, 2**28 - 1)]
    events += [enc.summary_event(2**28, [enc.scalar_value("train/loss", 1.0)]),  # a 5-byte step
               enc.summary_event(3, [enc.scalar_value("a", 1.0), enc.scalar_value("b", 2.0)]),
               enc.summary_event(4, [enc.pb_bytes(1, enc.pb_bytes(1, b"lr") + b"\x1d" + bytes(4))])]  # field 3
    data = b"".join(enc.record(e) for e in events)
    starts, lengths, end, bad, ok = frames(data)
    found, steps, values, tags, names, kinds = tfevent_scalars(data, starts, lengths)
    assert list(found) == [1, 1, 1, 1, 0, 0, 0] and names == [b"train/loss"]
    assert np.frombuffer(steps, np.int64).tolist() == [0, 127, 128, 2**28 - 1]
    assert np.frombuffer(values, np.float64).tolist() == [0.0, 31.75, 32.0, float(np.float32((2**28 - 1) / 4))]
    assert np.frombuffer(tags, np.int32).tolist() == [0, 0, 0, 0] and kinds == bytes(4)


@needs_frames
def test_the_compiled_reader_finds_tensorflow_2s_scalar_records(tmp_path):
    """tf.summary.scalar's records (a float32 in tensor_content, shape ()), add_scalar(new_style=True)'s
    (float_val, no shape) and make_tensor_proto's (float_val, shape ()), with the scalars plugin's metadata
    (with the scalar data class or not) or none, are found with their kind (1: no metadata, 2: scalars); a
    tensor of another dtype, of a shape, or metadata of another plugin or with more fields are not."""
    from gradtool.io._logscan import tfevent_scalars

    def value(tensor, meta=enc.pb_bytes(9, enc.plugin_metadata("scalars"))):
        return enc.pb_bytes(1, enc.pb_bytes(1, b"g") + enc.pb_bytes(8, tensor) + meta)

    f32 = [enc.tensor_proto(1, [1.5], [], content=True), enc.tensor_proto(1, [2.5]),
           enc.tensor_proto(1, [3.5], [])]
    scalar_class = enc.pb_bytes(9, enc.plugin_metadata("scalars") + b"\x20\x01")
    good = [value(t) for t in f32] + [value(f32[0], b""), value(f32[1], scalar_class)]
    bad = [value(enc.tensor_proto(2, [1.5], [], content=True)), value(enc.tensor_proto(1, [1.5], [1])),
           value(f32[0], enc.pb_bytes(9, enc.plugin_metadata("scalarz"))),
           value(f32[0], enc.pb_bytes(9, enc.plugin_metadata("scalars") + enc.pb_bytes(2, b"g"))),
           value(enc.tensor_proto(1, [1.5], [], content=True) + b"\x00")]
    data = b"".join(enc.record(enc.summary_event(s, [v])) for s, v in enumerate(good + bad))
    starts, lengths, end, _, ok = frames(data)
    found, steps, values, tags, names, kinds = tfevent_scalars(data, starts, lengths)
    assert list(found) == [1] * 5 + [0] * 5 and names == [b"g"]
    assert np.frombuffer(values, np.float64).tolist() == [1.5, 2.5, 3.5, 1.5, 2.5]
    assert list(kinds) == [2, 2, 2, 1, 2] and np.frombuffer(steps, np.int64).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("compiled", [True, False])
def test_a_signalling_nan_is_read_as_nan_without_a_warning(tmp_path, monkeypatch, compiled):
    """A float32 signalling NaN (bits 0x7FA00000) logged as a norm: NaN, the same both ways, and no NumPy
    RuntimeWarning on stderr (its cast to float64 raised "invalid value encountered in cast")."""
    import struct
    import warnings

    if not compiled:
        monkeypatch.setenv("GRADTOOL_NO_KERNELS", "1")
    p = tmp_path / "events.out.tfevents.1.host"
    snan = enc.pb_bytes(1, enc.pb_bytes(1, b"train/grad_norm") + b"\x15" + struct.pack("<I", 0x7FA00000))
    enc.write_events(p, [enc.file_version_event()] + [
        enc.summary_event(s, [snan if s == 3 else enc.scalar_value("train/grad_norm", 1.0)])
        for s in range(10)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = read_norm_log(str(p))
    assert h.steps == list(range(10)) and math.isnan(h.norms[3]) and h.norms[:3] == [1.0] * 3


def _dashboard_scalars(path):
    """What TensorBoard's scalars dashboard shows of the run at ``path``: its ``plugin_event_accumulator``
    (every value as a tensor, simple values migrated) and the data provider's choice of tags (metadata of
    the ``scalars`` plugin and the scalar data class), each tensor read by ``make_ndarray(...).item()``."""
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.util import tensor_util

    acc = pea.EventAccumulator(str(path), size_guidance={"tensors": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        try:
            meta = acc.SummaryMetadata(tag)
        except KeyError:  # a tag of no metadata
            continue
        if meta.plugin_data.plugin_name == "scalars" and meta.data_class == summary_pb2.DATA_CLASS_SCALAR:
            with warnings.catch_warnings():  # (its half_val reading sets an array's dtype: NumPy 2.5 warns)
                warnings.simplefilter("ignore", DeprecationWarning)
                out[tag] = [(e.step, repr(float(tensor_util.make_ndarray(e.tensor_proto).item())))
                            for e in acc.Tensors(tag)]
    return out


_NUMBERS = {1: st.floats(width=32), 2: st.floats(), 3: st.integers(-2**31, 2**31 - 1), 4: st.integers(0, 255),
            5: st.integers(-2**15, 2**15 - 1), 6: st.integers(-128, 127), 9: st.integers(-2**63, 2**63 - 1),
            17: st.integers(0, 2**16 - 1), 19: st.floats(width=16)}
_SHAPES = st.sampled_from([None, [], [1], [1, 1]])
_one_number = st.sampled_from(sorted(_NUMBERS)).flatmap(lambda d: st.tuples(st.just(d), _NUMBERS[d]))
_value_specs = st.one_of(
    st.tuples(st.just("simple"), st.sampled_from(["train/loss", "lr"]), st.floats(width=32)),
    # a scalar as tf.summary.scalar (tensor_content), make_tensor_proto or new_style add_scalar write it
    st.tuples(st.just("scalar"), st.sampled_from(["train/grad_norm", "epoch_loss"]), _one_number, _SHAPES,
              st.sampled_from(["content", "packed", "unpacked"]), st.booleans()),
    st.tuples(st.just("other"), st.sampled_from(["custom", "nometa"]), _one_number, _SHAPES),
    st.tuples(st.just("wide"), st.just("custom"), st.lists(st.floats(width=32), min_size=2, max_size=3)))


def _encoded(spec, first_of_tag):
    kind, tag = spec[:2]
    if kind == "simple":
        return enc.scalar_value(tag, spec[2])
    if kind == "scalar":
        (dtype, x), dims, form, meta = spec[2:]
        tensor = enc.tensor_proto(dtype, [x], dims, content=form == "content", packed=form == "packed")
        return enc.tensor_value(tag, tensor, "scalars" if meta or first_of_tag else None)
    if kind == "other":
        (dtype, x), dims = spec[2:]
        plugin = None if tag == "nometa" else "custom"
        return enc.tensor_value(tag, enc.tensor_proto(dtype, [x], dims), plugin)
    return enc.tensor_value(tag, enc.tensor_proto(1, spec[2], [len(spec[2])]), "custom")


@settings(max_examples=150, deadline=None)
@given(st.just("brain.Event:2"),  # (older versions' purges: the plugin accumulator's differ from the other's)
       st.lists(st.lists(st.one_of(st.tuples(st.integers(0, 40), st.lists(_value_specs, max_size=4)),
                                   st.tuples(st.integers(0, 40), st.none())), max_size=10),
                min_size=1, max_size=2),
       st.sampled_from([13, 8 << 20]))
@example("brain.Event:2", [[(3, [("scalar", "train/grad_norm", (1, 2.5), None, "content", True)]),
                            (4, [("scalar", "train/grad_norm", (3, -7), [1], "packed", False)]),
                            (2, None),  # a restart at step 2 drops steps 3 and 4
                            (2, [("scalar", "train/grad_norm", (19, 0.5), [], "unpacked", False)])]], 8 << 20)
def test_scalars_written_as_tensors_are_what_tensorboards_dashboard_shows(tmp_path_factory, version, files,
                                                                         window):
    """TensorFlow 2's tf.summary.scalar, Keras' callback and add_scalar(new_style=True) write a scalar as a
    tensor of one number with metadata naming the plugin ``scalars`` (on every value, or the first of a
    tag only): read as TensorBoard's scalars dashboard reads them, whatever the dtype (float, double,
    half, the integer types), the field holding the number (tensor_content, the dtype's repeated field
    packed or not), the shape ((), (1,), (1, 1), left out), beside simple values, tensors of another
    plugin or of no metadata, tensors of several numbers, and restarts (SessionLog.START)."""
    pytest.importorskip("tensorboard")
    d = tmp_path_factory.mktemp("run")
    for n, events in enumerate(files):
        seen: set[str] = set()
        encoded = [enc.file_version_event(version), enc.session_log_event(0, 1)] if n == 0 else []
        for step, specs in events:
            if specs is None:
                encoded.append(enc.session_log_event(step, 1))
                continue
            values = []
            for spec in specs:  # (the first value of a tag in a file has its metadata, as writers write)
                values.append(_encoded(spec, spec[1] not in seen))
                seen.add(spec[1])
            encoded.append(enc.summary_event(step, values))
        enc.write_events(d / f"events.out.tfevents.{1700000000 + n}.host", encoded)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tensorboard_log, "WINDOW", window)
        ours = scalar_series(str(d))
    assert _points(ours) == _dashboard_scalars(d)
    assert list(ours) == list(_dashboard_scalars(d))


@pytest.mark.parametrize("content", [True, False])
def test_a_bfloat16_scalar_is_the_top_half_of_a_float32(tmp_path, content):
    """bfloat16 (dtype 14; NumPy has none, nor TensorBoard's reader without TensorFlow): its 16 bits are the
    top half of the float32 of the same value."""
    p = tmp_path / "events.out.tfevents.1.host"
    bits = [0x3FC0, 0xC2F7, 0x7F80, 0x0001]  # 1.5, -123.5, inf, the least subnormal
    enc.write_events(p, [enc.file_version_event()] + [
        enc.summary_event(s, [enc.tensor_value("grad_norm", enc.tensor_proto(14, [b], [], content=content))])
        for s, b in enumerate(bits)])
    expected = [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in bits]
    assert expected[:3] == [1.5, -123.5, math.inf]
    assert scalar_series(str(p))["grad_norm"][1].tolist() == expected


def test_a_tensor_of_several_numbers_or_another_dtype_is_no_scalar(tmp_path):
    """Under the ``scalars`` plugin, a tensor of two numbers, of none, of a shape of two elements holding one
    value, of a type not read (complex, string), or a tensor_content of the wrong length gives no point."""
    p = tmp_path / "events.out.tfevents.1.host"
    bad = [enc.tensor_proto(1, [1.0, 2.0], [2]), enc.tensor_proto(1, [], []), enc.tensor_proto(1, [3.0], [2]),
           enc.pb_int(1, 8) + enc.pb_bytes(9, struct.pack("<ff", 1.0, 2.0)),  # complex64's scomplex_val
           enc.pb_int(1, 7) + enc.pb_bytes(8, b"abc"),  # a string
           enc.pb_int(1, 1) + enc.pb_bytes(4, b"\x00\x00\x80"),  # 3 bytes of tensor_content for a float
           enc.pb_int(1, 1) + enc.pb_bytes(4, struct.pack("<ff", 1.0, 2.0))]  # 8
    enc.write_events(p, [enc.file_version_event()]
                     + [enc.summary_event(s, [enc.tensor_value("grad_norm", t)]) for s, t in enumerate(bad)]
                     + [enc.summary_event(9, [enc.tensor_value("grad_norm", enc.tensor_proto(1, [4.0]))])])
    assert _points(scalar_series(str(p))) == {"grad_norm": [(9, "4.0")]}


def test_a_run_written_by_tensorboards_own_scalar_summaries(tmp_path):
    """Events written by tensorboard's own writer (``EventFileWriter``) with its TensorFlow 2 scalar
    summaries (``summary_v2.scalar_pb``): the norm history is read from them, where it said "no gradient-norm
    scalar among ;" before."""
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.scalar import summary_v2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(tmp_path))
    for step in range(30):
        for tag, v in (("train/grad_norm", 1.0 + step % 7), ("train/loss", 3.0 - step / 100)):
            w.add_event(event_pb2.Event(wall_time=1.7e9, step=step, summary=summary_v2.scalar_pb(tag, v)))
    w.close()
    h = read_norm_log(str(tmp_path))
    assert h.steps == list(range(30)) and h.norms == [1.0 + s % 7 for s in range(30)]
    assert h.loss == [float(np.float32(3.0 - s / 100)) for s in range(30)] and h.key == "train/grad_norm"


def test_a_run_without_scalars_says_so(tmp_path):
    """Only histograms and tensors of other plugins: an InputError that says no scalar was found (it listed
    an empty choice of tags)."""
    p = tmp_path / "events.out.tfevents.1.host"
    enc.write_events(p, [enc.file_version_event(), enc.summary_event(1, [enc.histogram_value("w")]),
                         enc.summary_event(2, [enc.tensor_value("t", enc.tensor_proto(1, [1.0]), "custom")])])
    with pytest.raises(InputError, match=r"tfevents\.1\.host: no scalar among its TensorBoard events"):
        read_norm_log(str(p))


def test_a_tags_plugin_is_its_first_metadatas_and_a_tensor_given_twice_is_merged(tmp_path):
    """As protobuf and TensorBoard read them: a tag whose first metadata names another plugin stays out even
    when later values say ``scalars``, and so does one of the plugin ``scalars`` and the data class
    "tensor"; a value's tensor given in two pieces (dtype, then the number) is one
    tensor; a tensor after a simple_value replaces it (the oneof's last member)."""
    pytest.importorskip("tensorboard")
    p = tmp_path / "events.out.tfevents.1.host"
    one = enc.tensor_proto(1, [2.0], [])
    meta = enc.pb_bytes(9, enc.plugin_metadata("scalars"))
    tensor_class = enc.pb_bytes(9, enc.plugin_metadata("scalars") + enc.pb_int(4, 2))  # data class: tensor
    enc.write_events(p, [enc.file_version_event(),
                         enc.summary_event(1, [enc.tensor_value("a", one, "custom")]),
                         enc.summary_event(2, [enc.tensor_value("a", one, "scalars")]),
                         enc.summary_event(3, [enc.pb_bytes(1, enc.pb_bytes(1, b"b")
                                                            + enc.pb_bytes(8, enc.pb_int(1, 1))
                                                            + enc.pb_bytes(8, enc.pb_float(5, 2.5)) + meta)]),
                         enc.summary_event(4, [enc.pb_bytes(1, enc.pb_bytes(1, b"c") + enc.pb_float(2, 9.0)
                                                            + enc.pb_bytes(8, one) + meta)]),
                         enc.summary_event(5, [enc.pb_bytes(1, enc.pb_bytes(1, b"d") + enc.pb_bytes(8, one)
                                                            + tensor_class)])])
    assert _points(scalar_series(str(p))) == {"b": [(3, "2.5")], "c": [(4, "2.0")]} == _dashboard_scalars(p)


_TF2_RECORDS = [enc.summary_event(7, [enc.tensor_value("g", t, plugin)]) for t in (
    enc.tensor_proto(1, [1.5], [], content=True), enc.tensor_proto(1, [2.5]), enc.tensor_proto(1, [3.5], []))
    for plugin in ("scalars", None)] + [enc.summary_event(9, [enc.pb_bytes(1, enc.pb_bytes(1, b"ab")
    + enc.pb_bytes(8, enc.tensor_proto(1, [4.5], [], content=True))
    + enc.pb_bytes(9, enc.plugin_metadata("scalars") + b"\x20\x01"))])]  # (with the scalar data class)


@needs_frames
@pytest.mark.parametrize("base", range(len(_TF2_RECORDS)))
def test_the_compiled_reader_reads_what_the_one_by_one_reader_reads(base):
    """Every record of tf.summary.scalar's layouts with one byte (of its summary) changed to one of the
    values that matter to the layout: those the compiled reader finds are read as the one-by-one reader
    (protobuf's semantics) reads them (step, tag, value, tensor or not, plugin), the unchanged one is
    found, and the NumPy reader finds and reads the same records (but those of a tag not UTF-8)."""
    from gradtool.io._logscan import tfevent_scalars

    good = _TF2_RECORDS[base]
    records = [good]
    for at in range(10, len(good)):
        for b in sorted({0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 13, 0x0A, 0x12, 0x15, 0x20, 0x22, 0x2A, 0x42, 0x4A,
                         0x7F, 0x80, 0xFF, (good[at] + 1) % 256, (good[at] - 1) % 256} - {good[at]}):
            records.append(good[:at] + bytes([b]) + good[at + 1:])
    data = b"".join(enc.record(r) for r in records)
    starts, lengths, end, _, ok = frames(data)
    found, steps, values, tags, names, kinds = tfevent_scalars(data, starts, lengths)
    found = np.frombuffer(found, np.bool_)
    assert found[0]
    steps, values = np.frombuffer(steps, np.int64).tolist(), np.frombuffer(values, np.float64).tolist()
    tags = np.frombuffer(tags, np.int32).tolist()
    raw = np.frombuffer(data, np.uint8)
    here = tensorboard_log._scalar_records_here(raw, np.frombuffer(starts, np.int64),
                                                np.frombuffer(lengths, np.int64))
    utf8 = np.array([names[t].isascii() for t in tags], bool)
    found_utf8 = np.zeros(found.size, bool)
    found_utf8[np.flatnonzero(found)[utf8]] = True
    assert here.found.tolist() == found_utf8.tolist()
    assert [repr(x) for x in here.values.tolist()] == [repr(x) for x in np.array(values)[utf8].tolist()]
    assert here.kinds.tolist() == np.frombuffer(kinds, np.uint8)[utf8].tolist()
    assert [here.names[t] for t in here.tags.tolist()] == [names[t].decode() for t in np.array(tags)[utf8]]
    for n, r in enumerate(np.flatnonzero(found).tolist()):
        if not names[tags[n]].isascii():  # (a window of such a tag is left to the NumPy reader by the caller)
            continue
        step, kind, what = tensorboard_log._event(records[r])
        assert (step, kind) == (steps[n], 5) and len(what) == 1
        ours = what[0]._replace(scalar=repr(what[0].scalar))  # (NaN: compared as its repr)
        plugin = "scalars" if kinds[n] == 2 else None
        assert ours == (names[tags[n]].decode(), repr(values[n]), kinds[n] > 0, plugin)


_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
_TF2_LOGS = os.path.join(_DATA, "tensorflow2")


@pytest.mark.parametrize("run", ["custom", "keras/train", "keras/validation", "../pytorch_new_style"])
def test_tensorflow_2s_and_pytorchs_new_style_event_files(run):
    """Event files TensorFlow 2.21 and Keras wrote, and PyTorch 2.13's add_scalar(new_style=True)
    (tests/suggest/data/*/README.md): read as TensorBoard's scalars dashboard reads them, and the norms as
    the loops logged them."""
    series = scalar_series(os.path.join(_TF2_LOGS, run))
    if run == "../pytorch_new_style":
        assert series["train/grad_norm"][1].tolist() == [1.0 + (s % 5) * 0.5 for s in range(30)]
        assert series["train/lr"][1].tolist() == [1e-3] * 30  # (a double: double_precision=True)
    if run == "custom":
        steps, norms = series["grad_norm"]
        assert steps.tolist() == list(range(40))
        assert norms.tolist() == [1.0 + (s % 7) * 0.25 for s in range(40)]
        assert series["loss"][1].tolist() == [float(np.float32(3.0 - s / 100)) for s in range(40)]
    if importlib.util.find_spec("tensorboard") is not None:
        assert _points(series) == _dashboard_scalars(os.path.join(_TF2_LOGS, run))
    tags = {"custom": 2, "keras/train": 4, "keras/validation": 2, "../pytorch_new_style": 3}
    assert len(series) == tags[run]


def test_a_keras_log_directory_reads_its_train_run(run):
    """`suggest-threshold logs/` on Keras' TensorBoard callback's directory (train/ and validation/): the
    run with the gradient norm, its 18 batches."""
    r = run("suggest-threshold", os.path.join(_TF2_LOGS, "keras"), "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    assert doc["source"]["run"]["name"] == "train" and doc["source"]["key"] == "batch_grad_norm"
    assert (doc["history"]["n"], doc["history"]["first_step"], doc["history"]["last_step"]) == (18, 0, 17)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 299), min_size=1, max_size=900), st.integers(1, 300),
       st.sampled_from([b"", b"\xff\xfe", b"ok"]))
def test_the_numpy_reader_finds_the_records_of_hundreds_of_tags_of_one_length(picks, tags, odd):
    """_scalar_records_here reads a window of add_scalar records of hundreds of tags of one length (each
    parameter's norm: grad_2.0_norm/layers.NNN.weight) all together, each with its tag, step and value,
    tags of other lengths (none) beside them; a tag that is not UTF-8 is left to the one-by-one reader
    (where its error is said), alone. The compiled reader finds the same records."""
    names = [f"grad_2.0_norm/layers.{k % tags:03d}.weight".encode() for k in range(300)] + [odd]
    chosen = [names[k] if k % 50 != 49 else odd for k in picks]
    records = [enc.summary_event(s, [enc.pb_bytes(1, enc.pb_bytes(1, tag) + enc.pb_float(2, s / 8))])
               for s, tag in enumerate(chosen)]  # (add_scalar's layout, of a tag of any bytes)
    data = b"".join(enc.record(r) for r in records)
    at, size = [], []
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        at.append(pos + 12)
        size.append(length)
        pos += length + 16
    raw = np.frombuffer(data, np.uint8)
    here = tensorboard_log._scalar_records_here(raw, np.array(at), np.array(size))
    utf8 = [tag != b"\xff\xfe" for tag in chosen]
    assert here.found.tolist() == utf8
    assert [here.names[t] for t in here.tags.tolist()] == [t.decode() for t in chosen if t != b"\xff\xfe"]
    assert here.steps.tolist() == [s for s, ok in enumerate(utf8) if ok]
    assert here.values.tolist() == [s / 8 for s, ok in enumerate(utf8) if ok]
    if frames is not None:
        from gradtool.io._logscan import tfevent_scalars

        found, steps, values, tag_numbers, tag_names, _ = tfevent_scalars(data, np.array(at), np.array(size))
        assert np.frombuffer(found, np.bool_).tolist() == [True] * len(chosen)
        assert [tag_names[t] for t in np.frombuffer(tag_numbers, np.int32).tolist()] == chosen


@needs_frames
def test_the_compiled_reader_finds_the_records_of_thousands_of_tags():
    """tfevent_scalars reads a window of 3,000 tags (each of 3,000 parameters' norm, twice) all together:
    a table of 1,024 tags left the records of the others to the one-by-one reader."""
    from gradtool.io._logscan import tfevent_scalars

    tags = [f"grad_2.0_norm/layers.{k}.weight" for k in range(3000)] * 2
    data = b"".join(enc.record(enc.summary_event(s, [enc.scalar_value(t, 0.5)])) for s, t in enumerate(tags))
    starts, lengths, end, bad, ok = frames(data)
    found, steps, values, numbers, names, kinds = tfevent_scalars(data, starts, lengths)
    assert np.frombuffer(found, np.bool_).all() and len(names) == 3000
    assert [names[t].decode() for t in np.frombuffer(numbers, np.int32).tolist()] == tags
