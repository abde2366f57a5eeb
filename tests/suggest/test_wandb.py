"""W&B run logs (wandb/run-<date>-<id>/run-<id>.wandb), which every W&B run writes locally, online or
offline, read without wandb. The Hugging Face Trainer logs train/grad_norm there whenever wandb is
installed; the logs were refused as "binary file". The fixtures are written by an encoder of this test's
own (the LevelDB log format and protobuf wire format, as wandb's datastore.py and wandb_internal.proto
define them); the reader was checked against logs written by wandb 0.31 (its Go core)."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gradtool.errors import InputError, UsageError
from gradtool.io.logs import read_norm_log
from tests.wandb_encoder import BLOCK, history, other_record, pb_bytes, pb_int, run_record, write_log


def hf_records(n, name="bright-owl-7", seconds=1795521146, every=10):
    """What the Trainer's WandbCallback logs: train/* keys and train/global_step; eval rows between."""
    recs = [run_record(name, seconds), other_record(100)]
    for i in range(1, n + 1):
        recs.append(history(i, i, {"train/loss": 3 - i / 100, "train/grad_norm": 1 + (i % 7) / 10,
                                   "train/learning_rate": 1e-4, "train/epoch": i / 10,
                                   "train/global_step": i * every}))
        if i % 10 == 0:
            recs.append(history(i, i, {"eval/loss": 2.0, "train/global_step": i * every}))
    return recs


def run_dir(root, rid, when, records):
    d = root / f"run-{when}-{rid}"
    d.mkdir(parents=True)
    (d / "files").mkdir()
    write_log(d / f"run-{rid}.wandb", records)
    return d


def test_a_trainer_run_log(tmp_path, run):
    d = run_dir(tmp_path / "wandb", "a7g1oqra", "20261124_101010", hf_records(40))
    (tmp_path / "wandb" / "latest-run").symlink_to(d.name)  # as wandb links it: not a second run
    for where in (tmp_path, tmp_path / "wandb", tmp_path / "wandb" / "latest-run", d,
                  d / "run-a7g1oqra.wandb"):
        h = read_norm_log(str(where))
        assert (h.kind, h.key, h.steps) == ("wandb", "train/grad_norm", [10 * i for i in range(1, 41)]), where
        assert h.norms == [1 + (i % 7) / 10 for i in range(1, 41)] and h.loss[0] == 2.99 and h.lr[0] == 1e-4
    r = run("suggest-threshold", str(tmp_path / "wandb"), "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["source"]["run"] == {"id": "a7g1oqra", "name": "bright-owl-7"}
    assert r.json()["source"]["kind"] == "wandb"
    r = run("stats", str(d / "run-a7g1oqra.wandb"))
    assert r.exit_code == 1 and "is a W&B run log (suggest-threshold reads" in r.stderr
    import numpy as np

    np.savez(d / "files" / "model.npz", w=np.ones(3))  # wandb.save()d: no step of dumps
    for where in (d, tmp_path / "wandb"):
        r = run("suggest-threshold", str(where), "--format", "json")
        assert r.exit_code == 0 and r.json()["source"]["kind"] == "wandb", (where, r.stderr)


def test_several_runs_are_chosen_by_name_id_or_latest(tmp_path, run):
    root = tmp_path / "wandb"
    run_dir(root, "aaaa1111", "20261120_090000", hf_records(30, "first", 1795600000))
    run_dir(root, "bbbb2222", "20261121_090000", hf_records(20, "second", 1795700000))
    with pytest.raises(UsageError, match=r"holds 2 W&B runs \('second' \(bbbb2222, .*\), 'first' "):
        read_norm_log(str(root))
    assert len(read_norm_log(str(root), run="first")) == 30
    assert len(read_norm_log(str(root), run="bbbb")) == 20
    assert len(read_norm_log(str(root), run="latest")) == 20
    r = run("suggest-threshold", str(tmp_path), "--run", "first", "--format", "json")
    assert r.exit_code == 0 and r.json()["source"]["run"]["name"] == "first"


def test_records_across_blocks_padding_and_values(tmp_path):
    """A record longer than a block (FIRST, MIDDLE, LAST), records ending < 7 bytes before a block's end
    (zero padding), NaN and Infinity as wandb writes them, a nested key, media (not numbers) left out,
    and W&B's own step when no train/global_step is logged."""
    recs = [other_record(80_000)]
    for i in range(400):  # ~150 bytes each: block ends fall at every offset
        v = math.nan if i == 7 else math.inf if i == 8 else 0.5 + i
        recs.append(history(i, i, {"grad_norm": v, "img": {"_type": "image-file", "path": "x.png"}}))
    recs.append(pb_int(1, 9) + pb_bytes(2, pb_bytes(1, pb_bytes(2, b"grads") + pb_bytes(2, b"norm")
                                                      + pb_bytes(16, b"3.5")) + pb_bytes(2, pb_int(1, 400))))
    p = str(write_log(tmp_path / "run-x.wandb", recs))
    h = read_norm_log(p)
    assert h.steps == list(range(400)) and h.key == "grad_norm"
    assert math.isnan(h.norms[7]) and h.norms[8] == math.inf
    assert [v for i, v in enumerate(h.norms) if i not in (7, 8)] == [0.5 + i for i in range(400)
                                                                      if i not in (7, 8)]
    nested = read_norm_log(p, key="grads.norm")  # the nested key, read and named
    assert (nested.steps, nested.norms) == ([400], [3.5])


def test_a_log_cut_off_at_the_end_is_read_up_to_the_cut(tmp_path):
    p = write_log(tmp_path / "run-x.wandb", hf_records(600)[:-1])  # ends in step 600's training row
    data = p.read_bytes()
    p.write_bytes(data[:-50])  # a run still writing, or killed: that row cut
    h = read_norm_log(str(p))
    assert len(h) == 599
    damaged = bytearray(data)
    damaged[200] ^= 0xFF  # a record in the first block of several
    assert len(data) > 2 * BLOCK
    p.write_bytes(bytes(damaged))
    with pytest.raises(InputError, match=r"run-x.wandb: damaged W&B log \(bad record at byte "):
        read_norm_log(str(p))


@given(st.lists(st.tuples(st.integers(0, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                          st.integers(0, 3000)), min_size=1, max_size=80))
def test_what_is_written_is_read(tmp_path_factory, rows):
    """Any sequence of rows (steps not going back: see test_logs' trainings tests) and filler records,
    read back as the step -> last value logged."""
    rows = sorted(rows, key=lambda r: r[0])
    recs = []
    for i, (step, v, filler) in enumerate(rows):
        recs.append(other_record(filler))
        recs.append(history(i, i, {"grad_norm": v, "train/global_step": step}))
    p = write_log(tmp_path_factory.mktemp("w") / "run-x.wandb", recs)
    h = read_norm_log(str(p))
    last = {}
    for step, v, _ in rows:
        last[step] = v
    assert h.steps == sorted(last) and h.norms == [last[s] for s in sorted(last)]


@given(st.binary(max_size=3000))
def test_any_bytes_after_the_header_are_read_or_refused_in_one_line(tmp_path_factory, tail):
    p = tmp_path_factory.mktemp("w") / "run-x.wandb"
    p.write_bytes(b":W&B" + struct.pack("<HB", 0xBEE1, 0) + tail)
    try:
        read_norm_log(str(p))
    except (InputError, UsageError) as exc:
        assert "\n" not in str(exc)


def test_a_record_longer_than_the_limit_is_skipped_not_held(tmp_path, monkeypatch):
    from gradtool.io import wandb_log

    monkeypatch.setattr(wandb_log, "MAX_RECORD", 100_000)
    recs = hf_records(5)[:3] + [other_record(250_000)] + hf_records(5)[3:]
    h = read_norm_log(str(write_log(tmp_path / "run-x.wandb", recs)))
    assert len(h) == 5


def test_a_project_with_mlflow_and_wandb_runs(tmp_path):
    """The Trainer reports to every tracker installed: mlruns/ and wandb/ side by side."""
    from test_mlflow import file_run, hf_metrics

    run_dir(tmp_path / "wandb", "bbbb2222", "20261121_090000", hf_records(20, "from-wandb", 1795700000))
    file_run(tmp_path / "mlruns", "aaaa1111aaaa1111aaaa1111aaaa1111", "from-mlflow", 1795600000000,
             hf_metrics(30))
    with pytest.raises(UsageError, match=r"holds 2 MLflow or W&B runs \('from-wandb' .*'from-mlflow'"):
        read_norm_log(str(tmp_path))
    assert read_norm_log(str(tmp_path), run="from-mlflow").kind == "mlflow"
    assert read_norm_log(str(tmp_path), run="latest").kind == "wandb"


def test_a_resumed_run_is_one_run_of_its_logs(tmp_path, run):
    """wandb.init(id=..., resume=...) writes a second run directory with the same run ID: one run, whose
    history continues in the later log (a step logged again keeps its later value)."""
    root = tmp_path / "wandb"
    first = hf_records(30, "long-run", 1795600000)
    resumed = [run_record("long-run", 1795700000)] + [
        history(i, i, {"train/grad_norm": 5.0, "train/global_step": i * 10}) for i in range(25, 51)]
    run_dir(root, "abc123", "20261121_090000", resumed)
    run_dir(root, "abc123", "20261120_090000", first)
    h = read_norm_log(str(root))
    assert h.steps == [10 * i for i in range(1, 51)] and h.run.id == "abc123"
    assert h.norms[23] == 1 + (24 % 7) / 10 and h.norms[24:] == [5.0] * 26  # step 250 on: the resumed log's
    assert any("run 'long-run' (abc123, 2026-11-25 09:46 UTC) was resumed: its 2 logs" in n for n in h.notes)
    r = run("suggest-threshold", str(root), "--format", "json")
    assert r.exit_code == 0 and any("was resumed" in w for w in r.json()["history"]["warnings"])


def test_a_log_file_names_its_run(tmp_path, run):
    p = write_log(tmp_path / "run-abc123.wandb", hf_records(30, "named"))
    r = run("suggest-threshold", str(p), "--format", "json")
    assert r.exit_code == 0 and r.json()["source"]["run"] == {"id": "abc123", "name": "named"}
    assert run("suggest-threshold", str(p), "--run", "named").exit_code == 0
    r = run("suggest-threshold", str(p), "--run", "other")
    assert r.exit_code == 2 and "no run 'other' among its 1 W&B runs ('named' (abc123, " in r.stderr


def test_a_log_on_standard_input_names_its_run_from_its_run_record(tmp_path, run):
    p = write_log(tmp_path / "copy.bin", hf_records(30, "named"))
    r = run("suggest-threshold", "-", "--format", "json", input=p.read_bytes())
    assert r.exit_code == 0 and r.json()["source"]["run"] == {"id": "abc123", "name": "named"}


@pytest.mark.parametrize("step_key", ["trainer/global_step", "global_step"])  # Lightning, torchtune
def test_other_trainers_steps_are_the_steps(tmp_path, step_key):
    # W&B's _step counts log calls: Lightning logs every 50 steps here, which _step shows as every step
    p = write_log(tmp_path / "run-x.wandb",
                  [history(i, i, {"grad_norm": 1.0 + i % 3, step_key: 50 * (i + 1)}) for i in range(30)])
    assert read_norm_log(str(p)).steps == [50 * (i + 1) for i in range(30)]


def _reference_row(record):
    """history_rows written plainly over proto_fields and _item_fields (the field reader alone): the
    reference for its indexed fast path. Fields of another wire type than the schema's are left out."""
    from gradtool.io.wandb_log import _item_fields, proto_fields

    hist = next((v for f, v in proto_fields(record) if f == 2 and isinstance(v, bytes)), None)
    if hist is None:
        return None
    row = {}
    for f, v in proto_fields(hist):
        if f == 1 and isinstance(v, bytes):
            key, number = _item_fields(v)  # an item by the field reader (its wire types: tested below)
            if number is not None:
                row[key] = number
        elif f == 2 and isinstance(v, bytes):
            row["_step"] = next((w for g, w in proto_fields(v) if g == 1 and isinstance(w, int)), 0)
    return row


_item_key = st.one_of(st.sampled_from(["train/grad_norm", "loss", "", "é/ü"]), st.text(max_size=200))
_item_value = st.one_of(st.floats(), st.integers(-10**20, 10**20), st.text(max_size=150),
                        st.sampled_from(["x" * 300, [1, 2], {"_type": "histogram"}, None]))
_raw_field = st.one_of(  # what else an item or a history record may hold: other fields, any wire type
    st.builds(pb_int, st.integers(1, 20), st.integers(0, 2**64 - 1)),
    st.builds(pb_bytes, st.integers(1, 20), st.binary(max_size=140)),
    st.builds(lambda f, b: bytes([f << 3 | 5]) + b, st.integers(1, 15), st.binary(min_size=4, max_size=4)))
_item = st.one_of(
    st.builds(lambda k, v: pb_bytes(1, k.encode()) + pb_bytes(16, __import__("json").dumps(v).encode()),
              _item_key, _item_value),  # as wandb writes it (the fast path)
    st.lists(st.one_of(st.builds(lambda k: pb_bytes(1, k.encode()), _item_key),
                       st.builds(lambda k: pb_bytes(2, k.encode()), _item_key),
                       st.builds(lambda v: pb_bytes(16, str(v).encode()), _item_value), _raw_field),
             max_size=5).map(b"".join))


@given(st.lists(st.one_of(_item.map(lambda it: pb_bytes(1, it)), _raw_field,
                          st.builds(lambda n: pb_bytes(2, pb_int(1, n)), st.integers(0, 2**63)),
                          st.builds(lambda b: pb_bytes(2, b), st.binary(max_size=12))), max_size=8),
       st.integers(0, 2**40), st.booleans())
@example([pb_bytes(1, pb_bytes(1, b"g") + pb_bytes(16, b"1.5") + pb_int(3, 5))], 1, False)  # a field after
@example([pb_bytes(1, pb_bytes(1, b"g") + pb_bytes(32, b"1.5"))], 1, False)  # 82 02: field 32, no value
@example([pb_bytes(1, b"\n\x01g\x82\x01\x031.5"), pb_bytes(2, b"\x08")], 1, False)  # a cut step
def test_history_rows_equal_the_plain_field_reader(fields, num, history_first):
    """The indexed fast path of history_rows gives what reading every field gives: items as wandb writes
    them and otherwise (key after value, nested keys, other fields, long keys and values, lengths of
    two bytes), steps, and fields of any wire type where the schema has another."""
    from gradtool.io.wandb_log import history_rows

    hist = pb_bytes(2, b"".join(fields))
    record = hist + pb_int(1, num) if history_first else pb_int(1, num) + hist
    try:
        want = _reference_row(record)
    except ValueError:
        with pytest.raises(ValueError):
            history_rows(record)
        return
    assert repr(history_rows(record)) == repr(want)  # repr: NaN equal to NaN, 1 and 1.0 told apart


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=6))
def test_any_record_contents_are_read_or_refused_in_one_line(tmp_path_factory, records):
    """Records with valid framing (so their CRCs pass) and any contents reach the protobuf reader: a
    history item of the wrong wire type gave TypeError and AttributeError tracebacks."""
    p = write_log(tmp_path_factory.mktemp("w") / "run-x.wandb",
                  [history(0, 0, {"grad_norm": 1.0})] + [pb_bytes(2, r) for r in records] + records)
    try:
        read_norm_log(str(p))
    except (InputError, UsageError) as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize("history_body", [pb_int(1, 7), pb_bytes(1, pb_int(1, 5)) + pb_bytes(2, pb_int(1, 3)),
                                          pb_bytes(2, pb_bytes(1, b"x"))])
def test_fields_of_another_wire_type_are_left_out(tmp_path, run, history_body):
    """An item that is a varint, an item's key that is a varint, a step number that is bytes: left out
    (protobuf's own readers skip them), not a traceback."""
    recs = [history(i, i, {"train/grad_norm": 1.0 + i % 3, "train/global_step": i}) for i in range(30)]
    p = write_log(tmp_path / "run-x.wandb", recs + [pb_int(1, 99) + pb_bytes(2, history_body)])
    h = read_norm_log(str(p))
    assert h.steps == list(range(30))
    r = run("suggest-threshold", str(p))
    assert r.exit_code == 0 and "Traceback" not in r.stderr
