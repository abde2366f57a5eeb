import csv
import functools
import importlib.util
import io
import json
import math
import os
import re

import numpy as np
import pytest

from gradtool.errors import InputError, UsageError
from gradtool.io.logs import read_norm_log

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-logs")
REAL_FILES = sorted(f for f in os.listdir(REAL) if f.endswith(".json")) if os.path.isdir(REAL) else []


@pytest.mark.skipif(not REAL_FILES, reason="../shared/real-logs not present")
@pytest.mark.parametrize("name", REAL_FILES)
def test_real_hf_logs_parse(name):
    h = read_norm_log(os.path.join(REAL, name))
    doc = json.load(open(os.path.join(REAL, name)))
    expected = [e for e in doc["log_history"] if "grad_norm" in e]
    assert len(h.steps) == len({e["step"] for e in expected}) and h.key == "grad_norm"
    assert h.steps == sorted(h.steps) and h.has_loss and h.has_lr
    assert min(h.norms) == min(e["grad_norm"] for e in expected)


@pytest.mark.skipif(not REAL_FILES, reason="../shared/real-logs not present")
@pytest.mark.parametrize("cut", [0.05, 0.5, 0.999])
def test_a_trainer_state_cut_short_says_so(tmp_path, run, cut):
    """A trainer_state.json cut short (a copy interrupted, a full disk) was "no JSON objects found": it
    was read as JSON Lines, where a "{" line is no object. Now the JSON error, and that the document
    stops before its closing brace."""
    text = open(os.path.join(REAL, REAL_FILES[0])).read()
    p = tmp_path / "trainer_state.json"
    p.write_text(text[: int(len(text) * cut)])
    said = r"trainer_state\.json: malformed JSON \(.*line \d+ column \d+.*\); the document stops before its "
    with pytest.raises(InputError, match=said + r"closing '\}': cut short"):
        read_norm_log(str(p))
    r = run("suggest-threshold", str(p))
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1 and "cut short" in r.stderr
    p.write_text(text.replace('"log_history": [', '"log_history": [,', 1))  # whole, but broken
    with pytest.raises(InputError, match="malformed JSON") as e:
        read_norm_log(str(p))
    assert "cut short" not in str(e.value)


def test_a_checkpoint_saved_only_in_part_is_left_out_of_its_run_directory(tmp_path):
    """A run killed while saving checkpoint-20 left its trainer_state.json cut short: the directory was
    unreadable as a whole. Now the other checkpoints are read and a note names the file left out."""
    for ck, upto in (("checkpoint-10", 10), ("checkpoint-20", 20)):
        (tmp_path / ck).mkdir()
        (tmp_path / ck / "trainer_state.json").write_text(json.dumps(
            {"log_history": [{"step": s, "grad_norm": float(s), "loss": 1.0} for s in range(1, upto + 1)]},
            indent=2))
    cut = tmp_path / "checkpoint-20" / "trainer_state.json"
    cut.write_text(cut.read_text()[:500])
    h = read_norm_log(str(tmp_path))
    assert h.steps == list(range(1, 11))
    (note,) = [n for n in h.notes if "checkpoint-20" in n]
    assert "cut short" in note and "left out" in note
    first = tmp_path / "checkpoint-10" / "trainer_state.json"
    first.write_text(first.read_text()[:300])
    with pytest.raises(InputError, match="cut short"):  # none readable: an error, not an empty history
        read_norm_log(str(tmp_path))


@pytest.mark.parametrize("use_msgspec", [True, False])
def test_records_dumped_one_after_another_with_indent(tmp_path, monkeypatch, use_msgspec):
    """Records each written with json.dump(..., indent=2) were read only where msgspec is installed
    (its decode_lines reads a stream of documents); without it, "no JSON objects found". A cut last
    record is left out, as a cut last line of JSON Lines is."""
    if not use_msgspec:
        monkeypatch.setitem(__import__("sys").modules, "msgspec", None)
    else:
        pytest.importorskip("msgspec")
    text = "".join(json.dumps({"step": s, "grad_norm": s / 10, "loss": 1.0}, indent=2) + "\n"
                   for s in range(1, 31))
    p = tmp_path / "records.json"
    p.write_text(text)
    h = read_norm_log(str(p))
    assert h.steps == list(range(1, 31)) and h.norms == [s / 10 for s in range(1, 31)]
    p.write_text(text[: text.rindex('"grad_norm"')])
    assert read_norm_log(str(p)).steps == list(range(1, 30))


def test_nan_infinity_tokens(tmp_path):
    p = tmp_path / "trainer_state.json"
    p.write_text('{"log_history": [{"step": 1, "grad_norm": 1.5, "loss": 2.0}, {"step": 2, "grad_norm": NaN, "loss": Infinity},'
                 ' {"step": 3, "grad_norm": Infinity}, {"step": 4, "eval_loss": 1.0}]}')
    h = read_norm_log(str(p))
    assert h.steps == [1, 2, 3] and math.isnan(h.norms[1]) and h.norms[2] == math.inf and h.loss[1] == math.inf


def test_run_directory_merges_checkpoints_without_duplicates(tmp_path):
    for ck, upto in (("checkpoint-10", 10), ("checkpoint-20", 20)):
        d = tmp_path / ck
        d.mkdir()
        (d / "trainer_state.json").write_text(json.dumps(
            {"log_history": [{"step": s, "grad_norm": float(s), "loss": 1.0} for s in range(1, upto + 1)]}))
    h = read_norm_log(str(tmp_path))
    assert h.steps == list(range(1, 21)) and h.norms[-1] == 20.0


def test_lightning_csv_with_sparse_rows(tmp_path):
    p = tmp_path / "metrics.csv"
    p.write_text("epoch,step,train_loss,grad_2.0_norm_total,val_loss\n0,0,2.5,1.25,\n0,0,,,2.4\n0,1,2.4,nan,\n0,2,2.3,1.5,\n")
    h = read_norm_log(str(p))
    assert h.key == "grad_2.0_norm_total" and h.steps == [0, 1, 2] and math.isnan(h.norms[1]) and h.loss[2] == 2.3


def test_a_csv_row_cut_short_at_the_end_is_left_out(tmp_path, run):
    """A run killed while writing its CSV log leaves a last row without a line end; its last cell was read
    as it stood: "60,12" of "60,1234.5,2.4" gave a norm of 12 at the step that exploded. A last row with
    fewer cells than the header is left out, with a note; one with all its cells cannot be told from a
    whole row (a Google Sheets export ends without a line end) and is read."""
    p = tmp_path / "metrics.csv"
    for general in (False, True):  # the fast paths, and the csv module's (a column of words)
        lead = "train," if general else ""
        ncols = 4 if general else 3
        body = f"{'phase,' if general else ''}step,grad_norm,loss\n" + "".join(
            f"{lead}{i},{1 + i % 5 / 10},{3 - i / 100}\n" for i in range(1, 60))
        cases = ((f"{lead}60,12", ncols - 1), (f'{lead}60,"1', ncols - 1),  # a quote left open, cut inside
                 (f"{lead}60,1234.5,2.4", None), ("\r", None))
        for last, cells in cases:
            p.write_text(body + last)
            h = read_norm_log(str(p))
            whole = last.endswith("2.4")
            assert len(h) == (60 if whole else 59) and h.steps[-1] == (60 if whole else 59), (last, general)
            assert h.norms[-1] == (1234.5 if whole else 1 + 59 % 5 / 10)
            said = [w for w in h.notes if "cut short" in w]
            if cells is None:
                assert said == [], (last, general)
            else:
                assert len(said) == 1
                assert f"has {cells} of {ncols} cells and no line end: cut short" in said[0]
    rows = "".join(f"{i},{1 + i % 5 / 10},2\n" for i in range(1, 60))
    p.write_text("step,grad_norm,loss\n" + rows + "60,12")
    r = run("suggest-threshold", str(p), "--format", "json")
    assert r.exit_code == 0 and r.json()["history"]["n"] == 59
    assert any("cut short" in w for w in r.json()["history"]["warnings"])


def test_tsv_and_explicit_key(tmp_path):
    p = tmp_path / "wandb.tsv"
    p.write_text("_step\tmy_norm\ttrain/loss\n1\t0.5\t3\n2\t0.7\t2\n")
    with pytest.raises(InputError, match="--key"):
        read_norm_log(str(p))
    h = read_norm_log(str(p), key="my_norm")
    assert h.norms == [0.5, 0.7] and h.loss == [3.0, 2.0]
    with pytest.raises(UsageError, match="no column"):
        read_norm_log(str(p), key="nope")


def test_jsonl_with_garbage_lines(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text('{"step": 1, "gnorm": 2.0}\nnot json at all\n{"step": 2, "gnorm": NaN}\n{"step": 3, "gn')
    h = read_norm_log(str(p))
    assert h.key == "gnorm" and h.steps == [1, 2]


def test_megatron_text_log(tmp_path):
    p = tmp_path / "train.log"
    p.write_text(
        " iteration      100/    1000 | consumed samples: 800 | learning rate: 1.0E-04 | lm loss: 5.123E+00 | loss scale: 1.0 | grad norm: 1.234 |\n"
        "random noise line\n"
        " iteration      200/    1000 | learning rate: 2.0E-04 | lm loss: 4.5E+00 | grad norm: nan |\n")
    h = read_norm_log(str(p))
    assert h.steps == [100, 200] and h.norms[0] == 1.234 and math.isnan(h.norms[1])
    assert h.loss == [5.123, 4.5] and h.lr == [1e-4, 2e-4]


@pytest.mark.parametrize("content", ["", "hello\nworld\n", "step,loss\n1,2\n"])
def test_logs_without_norms_are_input_errors(tmp_path, content):
    p = tmp_path / "x.log"
    p.write_text(content)
    with pytest.raises(InputError):
        read_norm_log(str(p))


@pytest.mark.parametrize("name, content, said", [
    ("trainer_state.json", '{"log_history": [], "global_step": 0}', "its log_history is empty"),
    ("metrics.csv", "step,grad_norm\n", "a header and no rows"),
    ("metrics.tsv", "step\tgrad_norm\r\n", "a header and no rows"),
    ("log.json", "[]", "no records"),
])
def test_a_log_with_nothing_logged_yet_says_so(tmp_path, name, content, said):
    # a run whose first log has not come yet: "found no gradient-norm key among its keys (); name it
    # with --key" sent the user after a key; none can help
    p = tmp_path / name
    p.write_text(content)
    for key in (None, "grad_norm"):
        with pytest.raises(InputError, match=f"{name}: {said}: nothing logged yet"):
            read_norm_log(str(p), key)


def test_tensorboard_events_written_by_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(tmp_path))
    for step in range(1, 41):
        for tag, value in (("grad-norm", 1.0 + step / 100), ("lm loss", 3.0 - step / 100), ("learning-rate", 1e-4)):
            summ = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            w.add_event(event_pb2.Event(step=step, summary=summ))
    w.close()
    (path,) = [p for p in tmp_path.iterdir() if "tfevents" in p.name]
    h = read_norm_log(str(path))
    assert h.key == "grad-norm" and h.steps == list(range(1, 41))
    assert h.norms[0] == pytest.approx(1.01, rel=1e-6) and h.loss[0] == pytest.approx(2.99, rel=1e-6)


def _tb_events(directory, steps, tag="train/grad_norm"):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(directory), filename_suffix=f".{steps[0]}")
    for step in steps:
        for t, value in ((tag, 1.0 + step / 100), ("train/loss", 3.0 - step / 100)):
            w.add_event(event_pb2.Event(step=step, summary=summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=t, simple_value=value)])))
    w.close()


def test_a_tensorboard_run_without_a_norm_says_why(tmp_path, run):
    # the Trainer's TensorBoard tags before transformers 4.38 (or without clipping): train/loss and
    # train/learning_rate, no train/grad_norm
    pytest.importorskip("tensorboard")
    _tb_events(tmp_path, [1, 2, 3], tag="train/learning_rate")
    r = run("suggest-threshold", str(tmp_path))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    assert "no gradient-norm scalar among train/learning_rate, train/loss; name it with --key" in r.stderr
    assert "logs grad_norm from transformers 4.38 on, and only with max_grad_norm > 0" in r.stderr


def test_a_tensorboard_log_directory(tmp_path, run):
    """`suggest-threshold output/` on a Trainer's output with TensorBoard logs (output/runs/<date_host>/)
    was "directory holds neither gradient dumps nor trainer_state.json files": the log directory is what
    TensorBoard users point at. A resumed run writes a second event file into the same directory."""
    pytest.importorskip("tensorboard")
    run_dir = tmp_path / "output" / "runs" / "Nov24_10-00-00_host"
    run_dir.mkdir(parents=True)
    _tb_events(run_dir, list(range(1, 21)))
    _tb_events(run_dir, list(range(21, 41)))
    for where in (tmp_path / "output", run_dir):
        h = read_norm_log(str(where))
        assert h.kind == "tensorboard" and h.key == "train/grad_norm" and h.steps == list(range(1, 41)), where
        assert h.norms[-1] == pytest.approx(1.4, rel=1e-6) and h.loss[0] == pytest.approx(2.99, rel=1e-6)
    other = tmp_path / "output" / "runs" / "Nov25_09-00-00_host"
    other.mkdir()
    _tb_events(other, list(range(1, 11)))
    os.utime(next(other.iterdir()), (2e9, 2e9))  # the newest run's events: listed first
    with pytest.raises(UsageError, match=r"output: holds 2 TensorBoard runs with a gradient norm "
                                         r"\('runs/Nov25_09-00-00_host' "
                                         r"\(.*\), 'runs/Nov24_10-00-00_host' \(.*\)\); choose one with "):
        read_norm_log(str(tmp_path / "output"))
    assert len(read_norm_log(str(tmp_path / "output"), run="runs/Nov24_10-00-00_host")) == 40
    assert len(read_norm_log(str(tmp_path / "output"), run="latest")) == 10
    r = run("suggest-threshold", str(tmp_path / "output"), "--run", "runs/Nov24_10-00-00_host",
            "--format", "json")
    assert r.exit_code == 0 and r.json()["source"]["run"]["name"] == "runs/Nov24_10-00-00_host"
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run("suggest-threshold", str(empty))
    assert r.exit_code == 1
    assert ("no gradient dumps, trainer_state.json, TensorBoard event files, MLflow, Trackio, W&B or "
            "DVCLive runs"
            in r.stderr)


def test_of_several_tensorboard_runs_the_only_one_with_a_norm_is_read(tmp_path, run):
    """Keras' TensorBoard callback writes logs/train/ and logs/validation/ (TensorFlow 2's tensor scalars):
    `suggest-threshold logs/` said "holds 2 TensorBoard runs; choose one with --run". The one run with a
    gradient norm is read, as among MLflow's and Trackio's runs; --run still names any, and runs without a
    norm are told so with their tags."""
    from tests import tensorboard_encoder as enc

    def write(sub, tags):
        (tmp_path / "logs" / sub).mkdir(parents=True)
        enc.write_events(tmp_path / "logs" / sub / "events.out.tfevents.1795000000.host.1.0.v2", [
            enc.file_version_event()] + [enc.summary_event(s, [enc.tensor_value(
                t, enc.tensor_proto(1, [1.0 + s % 5], [], content=True))]) for s in range(30) for t in tags])

    write("train", ["epoch_loss", "batch_grad_norm"])
    write("validation", ["epoch_loss"])
    h = read_norm_log(str(tmp_path / "logs"))
    assert (h.run.name, h.key, len(h)) == ("train", "batch_grad_norm", 30)
    assert read_norm_log(str(tmp_path / "logs"), run="latest").run.name == "train"  # the last with a norm
    r = run("suggest-threshold", str(tmp_path / "logs"), "--run", "validation")
    assert r.exit_code == 1 and "validation: no gradient-norm scalar among epoch_loss" in r.stderr
    r = run("suggest-threshold", str(tmp_path / "logs"), "--key", "epoch_loss")  # both hold it: choose
    assert r.exit_code == 2 and "holds 2 TensorBoard runs with a gradient norm" in r.stderr
    (tmp_path / "logs" / "train").rename(tmp_path / "train")
    write("eval", ["epoch_accuracy"])
    with pytest.raises(InputError, match=r"logs: no gradient-norm metric \(tried .*\) in its 2 TensorBoard "
                                         r"run\(s\) \(metrics: epoch_accuracy, epoch_loss\); name it with "):
        read_norm_log(str(tmp_path / "logs"))


# --- the JSON Lines fast paths (msgspec decoder, lines joined without a loop) equal the plain reader -----
def _plain_jsonl_history(text):
    """Independent reference: the standard decoder, one line at a time, garbage skipped."""
    from gradtool.io.logs import from_records

    records = []
    for line in text.splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict):
            records.append(r)
    return from_records(records, "ref", "jsonl")


def _as_tuple(h):
    return (h.steps, [repr(v) for v in h.norms], [repr(v) for v in h.loss], [repr(v) for v in h.lr], h.key)


from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_value = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64), st.integers(-10**6, 10**6), st.none())
_line = st.one_of(
    st.fixed_dictionaries({"step": st.integers(0, 50), "grad_norm": _value}, optional={"loss": _value, "lr": _value}),
    st.just("garbage"), st.just(""), st.just("   "), st.just('{"step": 3, "grad_n'))


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(_line, min_size=1, max_size=30), crlf=st.booleans(), use_msgspec=st.booleans())
def test_jsonl_fast_paths_equal_line_by_line_reference(monkeypatch_session, lines, crlf, use_msgspec):
    from gradtool.io.logs import read_jsonl

    text = ("\r\n" if crlf else "\n").join(json.dumps(x) if isinstance(x, dict) else x for x in lines)
    try:
        ref = _as_tuple(_plain_jsonl_history(text))
    except (InputError, UsageError) as exc:
        ref = type(exc)
    with monkeypatch_session.context() as m:
        if not use_msgspec:
            m.setitem(__import__("sys").modules, "msgspec", None)  # import fails: the stdlib decoder
        try:
            got = _as_tuple(read_jsonl("x.jsonl", text=text))
        except (InputError, UsageError) as exc:
            got = type(exc)
    assert got == ref


@pytest.fixture(scope="module")
def monkeypatch_session():
    with pytest.MonkeyPatch.context() as m:
        yield m


def test_msgspec_decoder_is_used_and_falls_back_on_nan_tokens():
    pytest.importorskip("msgspec")
    from gradtool.io.logs import _decode_json

    assert _decode_json('[{"a": 1.5}]') == [{"a": 1.5}]
    out = _decode_json('[{"a": NaN, "b": Infinity, "c": -Infinity}]')  # msgspec refuses; json takes them
    assert math.isnan(out[0]["a"]) and out[0]["b"] == math.inf and out[0]["c"] == -math.inf
    with pytest.raises(ValueError):
        _decode_json('[{"a": 1,}')


@pytest.mark.parametrize("text", [
    '{"a": 1, "a": 2}', '{"a": 123456789012345678901234567890}', '{"a": -9223372036854775809}',
    '{"a": "\\ud800"}', '{"a": 1e400}', '{"a": -0}', '{"a": -0.0}', '{"a": 1E5}', '{"a": 2.4703282292062328e-324}',
    '{"\\u00e9": "\\u00e9"}', '{"a":1} x', '{"a": 1,}', ' {"log_history": [{"b": null, "c": [true, false]}]} ',
    '{"a": NaN}', "[" * 100_000 + "]" * 100_000, "", "{}\n{}",
])
def test_json_documents_decode_as_json_loads_decodes_them(text):
    """A document is what json.loads makes of it, or the same error (msgspec decodes what it can and
    refuses the rest: lone surrogates, numbers beyond float64, NaN tokens, deep nesting)."""
    from gradtool.io.logs import _decode_json

    def decoded(decode):
        try:
            return repr(decode(text))
        except (ValueError, RecursionError) as exc:
            return type(exc), str(exc)

    assert decoded(_decode_json) == decoded(json.loads)


_num_or_none = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=64), st.integers(-10**6, 10**6),
                         st.none())


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.fixed_dictionaries(
    {"step": st.integers(0, 40), "grad_norm": st.one_of(st.floats(allow_nan=True, width=64), st.integers(0, 9))},
    optional={"loss": _num_or_none, "learning_rate": _num_or_none}), min_size=1, max_size=40),
    sort=st.booleans())
def test_vectorised_columns_equal_the_general_loop(rows, sort):
    """from_records' NumPy path (columns, last row of a step kept, rows passed through when already in
    order) gives the general per-row loop's history."""
    from gradtool.io import logs as logs_mod

    if sort:  # the usual log: steps increasing, each once (the pass-through branch)
        rows = list({r["step"]: r for r in rows}.values())
        rows.sort(key=lambda r: r["step"])
    fast = logs_mod.from_records(rows, "x", "jsonl")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(logs_mod, "_vectorised", lambda *a: None)
        slow = logs_mod.from_records(rows, "x", "jsonl")
    assert _as_tuple(fast) == _as_tuple(slow)
    assert all(type(v) is float for v in fast.norms) and all(type(s) is int for s in fast.steps)


# --- the typed msgspec path (keys from a sample, a row type with those keys, unknown keys forbidden) ------
_any_value = st.one_of(_value, st.booleans(), st.text(max_size=3), st.just([1, 2]), st.just({"a": 1}),
                       st.integers(2**63, 2**64), st.sampled_from(["NaN", "x NaN", "-Infinity", "Infinity"]))
_keys = st.sampled_from(["step", "grad_norm", "gnorm", "loss", "learning_rate", "epoch", "eval_loss",
                         "Grad_Norm", "NaN_count", "-Infinity"])


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.one_of(
    st.fixed_dictionaries({"step": st.integers(0, 60), "grad_norm": _value},
                          optional={"loss": _value, "learning_rate": _value, "epoch": _any_value}),
    st.dictionaries(_keys, _any_value, max_size=4)), min_size=1, max_size=25),
    sample=st.integers(1, 4))
def test_typed_jsonl_path_equals_the_general_reader(lines, sample):
    """read_jsonl's typed path (keys from the first ``sample`` lines only) gives what the line-by-line
    reference gives, or the same error, whatever later lines hold: new keys, other types, no norm."""
    pytest.importorskip("msgspec")
    from gradtool.io import logs as logs_mod

    text = "\n".join(json.dumps(x) for x in lines)
    try:
        ref = _as_tuple(_plain_jsonl_history(text))
    except (InputError, UsageError) as exc:
        ref = type(exc)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(logs_mod, "JSONL_SAMPLE_LINES", sample)
        try:
            h = logs_mod.read_jsonl("x.jsonl", text=text)
            got = _as_tuple(h)
        except (InputError, UsageError) as exc:
            got, h = type(exc), None
    assert got == ref
    if h is not None:
        _assert_arrays_match_lists(h)


def _assert_arrays_match_lists(h):
    steps, norms, loss, lr = h.arrays()
    assert steps.tolist() == h.steps
    np.testing.assert_array_equal(norms, np.asarray(h.norms, dtype=np.float64))
    for arr, values in ((loss, h.loss), (lr, h.lr)):
        assert np.ma.getmaskarray(arr).tolist() == [v is None for v in values]
        np.testing.assert_array_equal(arr.filled(np.nan), [np.nan if v is None else v for v in values])


def test_typed_jsonl_path_is_taken_for_a_log_with_nan_tokens():
    """json.dump writes NaN, Infinity, -Infinity bare (msgspec refuses them): quoted, the typed path reads
    them as the floats the standard decoder gives, rather than the whole log going line by line."""
    pytest.importorskip("msgspec")
    from gradtool.io import logs as logs_mod

    lines = [{"step": i, "grad_norm": [1.5, math.nan, math.inf][i % 3], "loss": [2.0, -math.inf][i % 2],
              "note": "NaN seen" if i == 0 else "ok"} for i in range(30)]
    text = "\n".join(json.dumps(x) for x in lines)
    assert _as_tuple(logs_mod.read_jsonl("x.jsonl", text=text)) == _as_tuple(_plain_jsonl_history(text))
    with pytest.MonkeyPatch.context() as m:  # (the compiled reader reads "NaN seen" as a word: off here)
        m.setattr(logs_mod, "json_columns", lambda *a, **k: None)
        m.setattr(logs_mod, "_msgspec_lines", lambda t: pytest.fail("the dict path was used"))
        m.setattr(logs_mod, "_concatenated_objects", lambda t: pytest.fail("the dict path was used"))
        with pytest.raises(pytest.fail.Exception):  # "NaN seen" inside a string: no JSON once quoted
            logs_mod.read_jsonl("x.jsonl", text=text)
        lines[0]["note"] = "ok"
        h = logs_mod.read_jsonl("x.jsonl", text="\n".join(json.dumps(x) for x in lines))
    assert _as_tuple(h) == _as_tuple(_plain_jsonl_history("\n".join(json.dumps(x) for x in lines)))
    assert [repr(v) for v in h.norms[:3]] == ["1.5", "nan", "inf"] and h.loss[1] == -math.inf


def test_typed_jsonl_path_is_taken_for_a_plain_log(tmp_path):
    """A usual log is decoded without a dict per line (the slower dict path is not reached)."""
    pytest.importorskip("msgspec")
    from gradtool.io import logs as logs_mod

    text = "".join(json.dumps({"step": i, "grad_norm": 1.0 + i, "loss": 2, "epoch": 0.1 * i}) + "\n"
                   for i in range(50))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(logs_mod, "_msgspec_lines", lambda t: pytest.fail("the dict path was used"))
        h = logs_mod.read_jsonl("x.jsonl", text=text)
    assert h.steps == list(range(50)) and h.norms == [1.0 + i for i in range(50)] and h.loss == [2.0] * 50
    assert h._arrays is not None  # the reader's arrays are handed over, not rebuilt
    _assert_arrays_match_lists(h)


@pytest.mark.parametrize("content", [
    "step,grad_norm,loss\n1,0.5,2\n2,0.7,\n3,nan,1.5\n",  # CSV, general path (an empty cell)
    "step,grad_norm,loss\n1,0.5,2\n3,0.7,2.5\n2,0.6,1\n",  # CSV, NumPy path, out of order
    '{"step": 2, "grad_norm": 1}\n{"step": 1, "grad_norm": 2, "loss": null}\n{"step": 2, "grad_norm": 3}\n',
])
def test_history_arrays_match_its_lists(tmp_path, content):
    from gradtool.io.logs import read_norm_log

    p = tmp_path / ("log.csv" if content.startswith("step,") else "log.jsonl")
    p.write_text(content)
    _assert_arrays_match_lists(read_norm_log(str(p)))


def test_steps_beyond_int64_are_analysed_not_crashed(tmp_path):
    """A step number too large for int64 (a float like 1e30 in a log) once crashed the analysis with
    OverflowError; it is now kept as a Python int."""
    from gradtool.io.logs import read_norm_log
    from gradtool.suggest import analyze_history

    p = tmp_path / "huge.jsonl"
    p.write_text("".join(json.dumps({"step": float(i) * 1e30, "grad_norm": 1.0 + i % 3}) + "\n"
                         for i in range(40)))
    h = read_norm_log(str(p))
    assert h.steps[1] == int(1e30)
    facts = analyze_history(*h.arrays())
    gaps = sorted(b - a for a, b in zip(h.steps, h.steps[1:]))
    assert facts.logging_interval == gaps[(len(gaps) - 1) // 2] and facts.steps == h.steps


@settings(max_examples=150, deadline=None)
@given(extra=st.text(min_size=1, max_size=8), junk=st.text(max_size=4),
       norm_key=st.sampled_from(["grad_norm", "gnorm", "x_grad_norm"]))
def test_typed_jsonl_path_takes_any_key_names(extra, norm_key, junk):
    """Keys with quotes, backslashes or control characters (msgspec cannot name a field so; found by
    fuzzing) leave the typed path to the dict path, with the same history, never an exception."""
    pytest.importorskip("msgspec")
    from gradtool.io import logs as logs_mod

    lines = [{"step": i, norm_key + junk: 1.0 + i, extra: i} for i in range(5)]
    text = "\n".join(json.dumps(x) for x in lines)
    try:
        ref = _as_tuple(_plain_jsonl_history(text))
    except (InputError, UsageError) as exc:
        ref = type(exc)
    try:
        got = _as_tuple(logs_mod.read_jsonl("x.jsonl", text=text))
    except (InputError, UsageError) as exc:
        got = type(exc)
    assert got == ref


# --- the CSV fast paths (msgspec's number parser, NumPy's loadtxt) equal the general row-by-row reader ----
_cell = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr),
    st.integers(-10**6, 10**6).map(str), st.integers(2**63, 2**70).map(str),
    st.sampled_from(["-0", "-0.0", "0", "1e400", "-1e-400", "2e-320", "1.", ".5", "+1", "1E3", "nan", "inf",
                     "", " 1.5", "2 ", '"3"', "x", "0x10", "1,5", "01", "NaN", "-nan", "+Inf", "-Infinity",
                     "infinit", "nan1", "1_0", "\t2", "a b", "  ", "train", "-", "e5", "1e",
                     "99999999999999999999"]))
_csv_header = st.sampled_from([["step", "grad_norm", "loss"], ["grad_norm"],
                               ["step", "loss", "grad_norm", "lr"],
                               ["epoch", "step", "grad_norm", "learning_rate"],
                               # per-parameter norms (Lightning's grad_norm): taken from the whole table
                               ["step", "grad_2.0_norm_total", "grad_2.0_norm/w", "grad_inf_norm/w"],
                               ["grad_2.0_norm_total", "grad_2.0_norm/w"],
                               # two parameters, each logged in its own rows (empty cells): found apart
                               ["step", "grad_2.0_norm/v", "grad_2.0_norm_total", "grad_2.0_norm/w"],
                               ["step", "grad_2.0_norm_total", "grad_2.0_norm/w", "grad_2.0_norm/w"]])


@settings(max_examples=300, deadline=None)
@given(header=_csv_header, data=st.data(), delim=st.sampled_from([",", "\t"]), crlf=st.booleans(),
       trailing=st.sampled_from(["", "\n", "\n\n"]), ragged=st.booleans(), block=st.integers(1, 40))
def test_csv_fast_paths_equal_the_row_by_row_reader(header, data, delim, crlf, trailing, ragged, block):
    """read_csv by the compiled reader's columns, by msgspec, and without either (NumPy's loadtxt), and
    the empty cells found with NumPy (a block of lines at a time: blocks of ``block`` characters and more,
    to a line's end), gives what the general csv-module path gives (history and notes), or the same error:
    for plain numbers (the fast paths), empty cells, words (the compiled reader), and cells only the
    general path reads."""
    from gradtool.io import logs as logs_mod

    steps = st.integers(0, 30).map(str)
    n = data.draw(st.integers(1, 12))
    rows = []
    for _ in range(n):
        width = len(header) + (data.draw(st.integers(-1, 1)) if ragged else 0)
        rows.append([data.draw(steps if h == "step" else _cell) for h in header[:width]]
                    + [data.draw(_cell) for _ in range(width - len(header))])
    nl = "\r\n" if crlf else "\n"
    text = nl.join(delim.join(r) for r in [header, *rows]) + trailing

    def read(**patches):
        with pytest.MonkeyPatch.context() as m:
            for name, value in patches.items():
                if name == "msgspec":
                    m.setitem(__import__("sys").modules, "msgspec", value)
                else:
                    m.setattr(logs_mod, name, value)
            try:
                h = logs_mod.read_csv("x.csv", text=text)
            except (InputError, UsageError) as exc:
                return type(exc)
            return _as_tuple(h), repr(h.tensor_norms), repr(h.tensor_max_abs), h.notes  # (last training's)

    none = lambda *a: None  # noqa: E731
    ref = read(_csv_fast=none, _csv_columns=none, _csv_numbers_with_gaps=none)
    assert read() == ref
    assert read(_csv_fast=none) == ref
    assert read(_csv_columns=none) == ref
    assert read(_csv_columns=none, msgspec=None) == ref
    assert read(_csv_columns=none, _csv_fast=none) == ref  # empty cells with NumPy
    assert read(_csv_columns=none, _csv_fast=none, msgspec=None) == ref
    gaps = functools.partial(logs_mod._csv_numbers_with_gaps, block=block)
    assert read(_csv_columns=none, _csv_fast=none, _csv_numbers_with_gaps=gaps) == ref
    assert read(_csv_columns=none, _csv_fast=none, _csv_numbers_with_gaps=gaps, msgspec=None) == ref


_NUMBER_CELL = st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr),
                        st.integers(-10**6, 10**6).map(str), st.sampled_from(["", "", "", "1e-4", "0.0"]))


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 5), st.data(), st.sampled_from([",", "\t"]), st.booleans(),
       st.sampled_from(["", "\n", "\r\n\n"]), st.integers(1, 60), st.booleans())
def test_a_csv_of_numbers_and_empty_cells_is_read_a_block_at_a_time(ncols, data, delim, crlf, trailing, block,
                                                                   msgspec_too):
    """_csv_numbers_with_gaps reads a rectangular CSV of numbers and empty cells (one at least) a block
    of lines at a time, whatever the blocks (of ``block`` characters and more, to a line's end): its
    columns are each cell's number, NaN and not given where the cell is empty, as the csv module splits
    the rows; by msgspec's parse and by NumPy's."""
    from gradtool.io import logs as logs_mod

    header = [f"c{i}" for i in range(ncols)]
    rows = data.draw(st.lists(st.lists(_NUMBER_CELL, min_size=ncols, max_size=ncols), min_size=1, max_size=15))
    rows[data.draw(st.integers(0, len(rows) - 1))][data.draw(st.integers(0, ncols - 1))] = ""
    nl = "\r\n" if crlf else "\n"
    text = nl.join(delim.join(r) for r in [header, *rows]) + trailing
    with pytest.MonkeyPatch.context() as m:
        if not msgspec_too:
            m.setitem(__import__("sys").modules, "msgspec", None)
        got = logs_mod._csv_numbers_with_gaps(text, header, delim, block=block)
    assert got is not None and got.n_rows == len(rows) and got.keys == header
    for c, name in enumerate(header):
        given, values, _ = got.column(name)
        cells = [r[c] for r in list(csv.reader(io.StringIO(text), delimiter=delim))[1:len(rows) + 1]]
        assert given.tolist() == [cell != "" for cell in cells]
        assert [repr(v) for v in values.tolist()] == [repr(float(cell)) if cell else "nan" for cell in cells]


def _csv_columns_or_skip():
    from gradtool.io.compiled import log_readers

    readers = log_readers()
    if readers is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    return readers.csv_columns


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=" \t+-.0123456789eEinfatyINFATYx_", max_size=12)
       | st.sampled_from([" 1.5\t", "-nan", "+Inf", "-Infinity", "01", "1.", "1e5", "", "x", "nan", "INF",
                          "-0", "1e400", "99999999999999999999999", "\x0c1", "a\x01"]))
@example(" 1.5\t")
def test_the_compiled_csv_reader_reads_a_cell_as_the_general_reader(cell):
    """Each cell the compiled CSV reader takes is what the general reader's ``_num`` makes of it (a number,
    or none: empty, a word); any other it leaves to the csv module (None)."""
    from gradtool.io.logs import _num

    got = _csv_columns_or_skip()(cell + "\n", 1, ",")
    if got is None:
        return
    rows, width, values, flags = got
    want = _num(cell)
    assert rows == 1 and width == (1 if cell else 0)  # (a blank line: a row of no cell)
    assert flags[0][0] == (want is not None)
    if want is not None:
        assert repr(np.frombuffer(values[0], np.float64)[0].item()) == repr(want)


class _Str(str):
    """A subclass of str (a value some parser hands over as one)."""


def _num_by_words(v):
    """_num as it was written before it tried ``float`` first: words, spaces and signs by hand."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if not isinstance(v, str):
        return None
    s = v.strip()
    if not s:
        return None
    low = s.lower()
    if low in ("nan", "+nan", "-nan"):
        return math.nan
    if low in ("inf", "+inf", "infinity", "+infinity"):
        return math.inf
    if low in ("-inf", "-infinity"):
        return -math.inf
    try:
        return float(s)
    except ValueError:
        return None


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=" \t\n\r\x0b\x0c\x85\xa0\u2003+-.0123456789eEinfatyINFATYx_\u0661\u0663", max_size=12)
       | st.sampled_from(["-nan", "+NaN", " -NAN ", "+Infinity", "-inf", "1_000", "_1", "1__0", "\u0661.5",
                          "\x00", "1\x00", "nan\n", "\u3000inf", "0x10", "1e400", "-1e-400"])
       | st.text(alphabet=" +-.0123456789eEnaifNAIF", max_size=8).map(_Str)
       | st.floats() | st.integers() | st.booleans() | st.none())
def test_num_reads_a_value_as_it_did_word_by_word(v):
    """_num, which tries float() on a string first, reads every value as its word-by-word form did:
    numbers, bools and None; strings (and a subclass's) with any spaces around (Unicode's too), signs, nan
    and inf words in any case (NaN positive), underscores, digits of other scripts, NUL, nothing."""
    from gradtool.io.logs import _num

    got, want = _num(v), _num_by_words(v)
    assert repr(got) == repr(want) and (got is None or math.copysign(1, got) == math.copysign(1, want))


def test_the_compiled_csv_reader_takes_the_usual_cells():
    """What the compiled CSV reader reads itself rather than leaving it to the csv module: numbers as
    Python prints them and with leading zeros or a bare point, NaN/inf words, words, empty cells, cells in
    spaces and tabs, CRLF lines; rows shorter than the header (the width read), cells beyond it; not a log
    whose columns would take far more memory than its text."""
    csv_columns = _csv_columns_or_skip()
    cells = [" 1.5\t", "-nan", "+Inf", "-Infinity", "01", "1.", "1e5", "", "x", "nan", "-0", "1e400", "train"]
    for cell in cells:
        assert csv_columns(cell + "\n", 1, ",") is not None, cell
    rows, width, values, flags = csv_columns("1,2\r\n3\r\n\r\n", 3, ",")
    assert (rows, width) == (3, 2) and [list(f) for f in flags] == [[1, 1, 0], [1, 0, 0], [0, 0, 0]]
    assert csv_columns("1,2,3,4\n", 2, ",")[1:2] == (2,)
    for refused in ['1,"2"\n', "1\r2\n", "1,\x00\n", "1,.5\n", "1,1_0\n", "1,a b\n"]:
        assert csv_columns(refused, 2, ",") is None, refused
    assert csv_columns("1\n" * 1000, 65536, ",") is None  # short rows under a wide header: ~590 MB of columns


@pytest.mark.parametrize("text", [
    "step,grad_2.0_norm_total,grad_2.0_norm/w,grad_inf_norm/w\n0,1.0,0.5\n1,2.0,0.6\n",  # rows short of it
    "step,grad_2.0_norm_total,grad_2.0_norm/w\n0,1.0,0.5\n1,2.0,nan\n1,3.0,0.7\n2,4.0,0.8\n",  # a step again
    "step,grad_2.0_norm_total,grad_2.0_norm/w,name\n0,1.0,0.5,a\n1,2.0,0.6,b\n",  # a column of words
])
def test_per_parameter_norms_of_a_numeric_csv_are_the_general_readers(text):
    """A CSV of per-parameter norms parsed whole (each parameter's norms found at the steps by a binary
    search) gives the general csv-module reader's history; where the table cannot be parsed whole (rows
    of another width, words), the wanted columns are and the rows give the per-parameter norms."""
    from gradtool.io import logs as logs_mod

    def read():
        h = logs_mod.read_csv("x.csv", text=text)
        return _as_tuple(h), repr(h.tensor_norms), repr(h.tensor_max_abs)

    fast = read()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(logs_mod, "_csv_fast", lambda *a: None)
        m.setattr(logs_mod, "_csv_columns", lambda *a: None)
        assert read() == fast
    with pytest.MonkeyPatch.context() as m:
        m.setattr(logs_mod, "_csv_columns", lambda *a: None)
        assert read() == fast


@settings(max_examples=300, deadline=None)
@given(table=st.lists(st.lists(st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr), st.integers(-2**80, 2**80).map(str),
    st.sampled_from(["1E-5", "-0.0", "0e0", "123456789.123456789e-300"])), min_size=3, max_size=3),
    min_size=1, max_size=20),
       delim=st.sampled_from([",", "\t"]), crlf=st.booleans())
def test_msgspec_csv_numbers_are_pythons_floats(table, delim, crlf):
    """Every cell of a plain numeric CSV is read, to the bit, as ``float(cell)`` reads it (an independent
    reference), and the fast path is taken (not None) for such input."""
    pytest.importorskip("msgspec")
    from gradtool.io.logs import csv_numbers_msgspec

    body = ("\r\n" if crlf else "\n").join(delim.join(r) for r in table) + "\n"
    got = csv_numbers_msgspec(body, delim, 3)
    assert got is not None and got.shape == (len(table), 3)
    want = np.array([[float(c) for c in r] for r in table], dtype=np.float64)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("body, why", [
    ("1,2,3\n4,5\n6,7,8,9\n", "cells per line differ although the total matches"),
    ("1,2,3\n\n4,5,6\n", "a blank line"),
    ("1,,3\n", "an empty cell"),
    ("1,-0,3\n", "integer -0, which msgspec reads as +0.0"),
    ("1,nan,3\n", "not a JSON number"),
    ('1,"2",3\n', "a quoted cell"),
])
def test_msgspec_csv_numbers_refuse_what_they_cannot_read_exactly(body, why):
    pytest.importorskip("msgspec")
    from gradtool.io.logs import csv_numbers_msgspec

    assert csv_numbers_msgspec(body, ",", 3) is None, why
    assert csv_numbers_msgspec("1,2,3\n4,5,6\n", ",", 3) is not None


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_numeric_log_is_analysed_without_lists_of_its_columns(tmp_path, monkeypatch, run, kind):
    """A log read with NumPy (CSV) or msgspec (JSON Lines) hands over arrays only; `suggest-threshold
    --format json` then never builds the per-step lists (10^6 Python objects each), and the lists, when
    asked for, are what the row-by-row reader gives."""
    pytest.importorskip("msgspec")
    from gradtool.io import logs as logs_mod

    rows = [(i, 1.0 + (i * 7919 % 13) / 10, 3.0 - i / 500) for i in range(400)]
    p = tmp_path / f"log.{kind}"
    if kind == "csv":
        p.write_text("step,grad_norm,loss\n" + "".join(f"{s},{v!r},{lo!r}\n" for s, v, lo in rows))
    else:
        p.write_text("".join(json.dumps({"step": s, "grad_norm": v, "loss": lo}) + "\n" for s, v, lo in rows))
    h = read_norm_log(str(p))
    assert h._steps is None and h._norms is None  # arrays only
    assert h.steps == [s for s, _, _ in rows] and h.norms == [v for _, v, _ in rows]
    assert h.loss == [lo for _, _, lo in rows] and h.lr == [None] * len(rows) and len(h) == len(rows)
    with monkeypatch.context() as m:
        for name in ("steps", "norms", "loss", "lr"):
            m.setattr(logs_mod.NormHistory, name, property(lambda self: pytest.fail("a list was built")))
        r = run("suggest-threshold", str(p), "--format", "json")
        assert r.exit_code == 0, r.stderr
        assert r.json()["history"]["has_loss"] is True and r.json()["history"]["last_step"] == 399
        table = run("suggest-threshold", str(p))  # the chart takes the arrays too
        assert table.exit_code == 0 and "global-norm" in table.stdout


COMPRESS = {"gzip": __import__("gzip").compress, "bzip2": __import__("bz2").compress,
            "xz": __import__("lzma").compress}


@pytest.mark.skipif(not REAL_FILES, reason="../shared/real-logs not present")
@pytest.mark.parametrize("comp", sorted(COMPRESS))
def test_a_compressed_log_reads_as_the_log(tmp_path, comp):
    """Rotated and archived logs are compressed (``trainer_state.json.gz``, ``metrics.csv.gz``): they read
    exactly as the plain file, whatever their name."""
    src = os.path.join(REAL, REAL_FILES[0])
    p = tmp_path / "archived"
    p.write_bytes(COMPRESS[comp](open(src, "rb").read()))
    h, plain = read_norm_log(str(p)), read_norm_log(src)
    assert (h.steps, h.norms, h.loss, h.source) == (plain.steps, plain.norms, plain.loss, str(p))


def test_a_compressed_csv_is_known_by_its_name_under_the_suffix(tmp_path):
    rows = "step,grad_norm,loss\n" + "".join(f"{s},{1 + s / 10},{2 - s / 100}\n" for s in range(1, 41))
    (tmp_path / "metrics.csv").write_text(rows)
    (tmp_path / "metrics.csv.gz").write_bytes(COMPRESS["gzip"](rows.encode()))
    a, b = read_norm_log(str(tmp_path / "metrics.csv")), read_norm_log(str(tmp_path / "metrics.csv.gz"))
    assert (a.steps, a.norms, a.loss) == (b.steps, b.norms, b.loss) and len(a.steps) == 40


def test_corrupt_truncated_and_oversized_compressed_logs(tmp_path, monkeypatch):
    from gradtool.io import logs

    whole = COMPRESS["gzip"](b"step,grad_norm\n" + b"1,2.0\n" * 20000)
    cut = tmp_path / "cut.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"cut.gz: corrupt or truncated gzip data"):
        read_norm_log(str(cut))
    bad = tmp_path / "bad.xz"
    bad.write_bytes(COMPRESS["xz"](b"step,grad_norm\n1,2\n")[:12] + b"\xff" * 40)
    with pytest.raises(InputError, match=r"bad.xz: corrupt or truncated xz data"):
        read_norm_log(str(bad))
    monkeypatch.setattr(logs, "MAX_LOG_BYTES", 1 << 16)  # a decompression bomb stops at the limit
    big = tmp_path / "big.gz"
    big.write_bytes(whole)
    with pytest.raises(InputError, match=r"big.gz: log larger than"):
        read_norm_log(str(big))


def test_zstd_and_pickles_given_as_logs_are_named(tmp_path):
    import pickle

    z = tmp_path / "train.log.zst"
    z.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 20)
    with pytest.raises(InputError, match=r"is zstd-compressed; decompress it first, or pipe it in: zstd -dc"):
        read_norm_log(str(z))
    p = tmp_path / "history.pkl"
    p.write_bytes(pickle.dumps({"grad_norm": [1.0, 2.0]}, protocol=4))
    with pytest.raises(InputError, match=r"is a Python pickle, not a training log; gradtool never loads"):
        read_norm_log(str(p))


@pytest.mark.parametrize("codec, newline", [("utf-8-sig", "\r\n"), ("utf-16", "\n"), ("utf-16", "\r\n"),
                                            ("utf-16-le", "\n"), ("utf-16-be", "\n")])
def test_byte_order_marks_and_windows_line_ends(tmp_path, codec, newline):
    """Excel's "CSV UTF-8" starts with a byte-order mark, which made the first column "\\ufeffstep": the
    steps were silently replaced by row numbers, and a JSON Lines log was "no gradient-norm values
    found". Windows PowerShell's `>` writes UTF-16 with a mark, which was refused as binary."""
    mark = "" if codec in ("utf-8-sig", "utf-16") else "\ufeff"  # those two codecs write the mark themselves
    rows = ["step,grad_norm,loss"] + [f"{s * 10},{1 + s / 100},{2 - s / 100}" for s in range(1, 41)]
    jsonl = [json.dumps({"step": s * 10, "grad_norm": 1 + s / 100}) for s in range(1, 41)]
    for name, lines, kind in (("metrics.csv", rows, "csv"), ("log.jsonl", jsonl, "jsonl")):
        p = tmp_path / name
        p.write_bytes((mark + newline.join(lines) + newline).encode(codec))
        assert p.read_bytes()[:2] in (b"\xef\xbb", b"\xff\xfe", b"\xfe\xff")
        h = read_norm_log(str(p))
        assert h.steps == [s * 10 for s in range(1, 41)] and h.key == "grad_norm", (name, h.steps[:3])
        assert h.norms == [1 + s / 100 for s in range(1, 41)] and h.kind == kind


def _hf_console(path, n=120, spike=80):
    """What `kubectl logs` shows of a Hugging Face Trainer: tqdm fragments (\\r), the metrics dicts it
    prints, eval dicts, a NaN, transformers 4.38's tensor repr, the final summary."""
    lines = ["***** Running training *****", "  Num examples = 10000"]
    norms = []
    for i in range(n):
        g = 1.0 + (i % 7) / 10 + (20.0 if i == spike else 0.0)
        norms.append(g)
        shown = f"tensor({g}, device='cuda:0')" if i == 5 else "nan" if i == 9 else repr(g)
        lines.append(f"\r  {i}%|###   | {i * 10}/1200 [00:{i:02d}<04:56,  1.23it/s]"
                     f"{{'loss': {2.5 - i / 100}, 'grad_norm': {shown}, 'learning_rate': 5e-05, "
                     f"'epoch': {i / 40}}}")
        if i % 50 == 49:
            lines.append("{'eval_loss': 2.1, 'eval_runtime': 3.2, 'epoch': 1.0}")
    lines.append("{'train_runtime': 1234.5, 'train_loss': 1.9, 'epoch': 3.0}")
    path.write_text("\n".join(lines) + "\n")
    norms[9] = math.nan
    return norms


def test_hugging_face_trainer_console_output(tmp_path):
    """The Trainer's console output, the usual thing `kubectl logs trainer | gradtool suggest-threshold -`
    reads, was "no 'grad norm: X' values found"."""
    p = tmp_path / "train.log"
    norms = _hf_console(p)
    h = read_norm_log(str(p))
    assert h.kind == "console" and h.key == "grad_norm" and h.steps == list(range(len(norms)))
    assert h.norms[:9] == norms[:9] and math.isnan(h.norms[9]) and h.norms[10:] == norms[10:]
    assert h.loss[:3] == [2.5, 2.49, 2.48] and h.lr[0] == 5e-05
    assert h.notes == [f"{p}: the log gives no step numbers: steps are the order of its lines "
                       "(0, 1, 2, ...), not training steps; the Trainer's trainer_state.json (in each "
                       "checkpoint-*/ of its output directory) has the steps, and every digit"]
    bare = tmp_path / "dicts.log"  # only the dicts (grep grad_norm train.log): it opens with {
    bare.write_text("".join(f"{{'loss': 2.0, 'grad_norm': {1 + i / 10}, 'epoch': {i}}}\n" for i in range(30)))
    h = read_norm_log(str(bare))
    assert h.kind == "console" and h.norms == [1 + i / 10 for i in range(30)]


def test_fairseq_json_log_lines(tmp_path):
    p = tmp_path / "train.log"
    rows = [f'2023-01-01 10:00:{i % 60:02d} | INFO | train_inner | {{"epoch": 1, "update": {i / 1000}, '
            f'"loss": "{12 - i / 100}", "num_updates": "{i * 100}", "lr": "1.25e-05", '
            f'"gnorm": "{1 + i % 5}", "train_wall": "12"}}' for i in range(1, 101)]
    p.write_text("fairseq-train data-bin --log-format json\n" + "\n".join(rows) + "\n")
    h = read_norm_log(str(p))
    assert h.kind == "console" and h.key == "gnorm" and h.steps == [i * 100 for i in range(1, 101)]
    assert h.norms == [float(1 + i % 5) for i in range(1, 101)] and h.loss[0] == 11.99
    assert len(h.notes) == 1 and "fairseq's gnorm is the mean over each logging interval" in h.notes[0]


def _fairseq_log(fmt: str, epochs: int = 3, per_epoch: int = 1050, interval: int = 100) -> tuple[str, dict]:
    """fairseq-train's console as fairseq_cli/train.py writes it: a train_inner line every ``interval``
    updates (the interval's mean gnorm), and at each epoch's end a "train" line of the epoch's means at
    the epoch's last update (not a multiple of the interval here: 1050, 2100, ...), then a "valid" line;
    ``fmt`` "simple" (its default off a terminal) or "json". Also the interval lines' {step: gnorm}."""
    lines, want = [], {}
    for epoch in range(1, epochs + 1):
        for u in range(1, per_epoch + 1):
            step = (epoch - 1) * per_epoch + u
            if step % interval:
                continue
            want[step] = g = round(1 + (step // interval) % 7 / 10, 3)
            if fmt == "json":
                lines.append(f'2024-05-01 10:00:00 | INFO | train_inner | {{"epoch": {epoch}, "update": '
                             f'{epoch - 1 + u / per_epoch:.3f}, "loss": "9.5", "num_updates": "{step}", '
                             f'"lr": "1e-05", "gnorm": "{g}", "loss_scale": "128"}}')
            else:
                lines.append(f"2024-05-01 10:00:00 | INFO | train_inner | epoch {epoch:03d}:    {u} / "
                             f"{per_epoch} loss=9.5, nll_loss=9.2, ppl=590, wps=1000, ups=1, "
                             f"num_updates={step}, lr=1e-05, gnorm={g}, loss_scale=128, wall=60")
        last = epoch * per_epoch
        lines.append(f"2024-05-01 10:10:00 | INFO | fairseq_cli.train | end of epoch {epoch} (average epoch "
                     "stats below)")
        if fmt == "json":
            lines.append(f'2024-05-01 10:10:00 | INFO | train | {{"epoch": {epoch}, "train_loss": "9.1", '
                         f'"train_gnorm": "9.999", "train_num_updates": "{last}"}}')
            lines.append(f'2024-05-01 10:10:00 | INFO | valid | {{"epoch": {epoch}, "valid_loss": "8.5", '
                         f'"valid_num_updates": "{last}"}}')
        else:
            lines.append(f"2024-05-01 10:10:00 | INFO | train | epoch {epoch:03d} | loss 9.1 | nll_loss "
                         f"8.9 | num_updates {last} | lr 1e-05 | gnorm 9.999 | loss_scale 128 | wall 600")
            lines.append(f"2024-05-01 10:10:00 | INFO | valid | epoch {epoch:03d} | valid on 'valid' "
                         f"subset | loss 8.5 | nll_loss 8.2 | num_updates {last} | best_loss 8.5")
    return "\n".join(lines) + "\n", want


@pytest.mark.parametrize("fmt", ["simple", "json"])
def test_fairseq_end_of_epoch_means_are_not_steps(tmp_path, fmt):
    """fairseq prints each epoch's mean gnorm at the epoch's last update; it was read as that step's norm
    (the simple format: an observation of 9.999 at 1050, 2100, 3150, "spikes" above the threshold; the JSON
    format: a warning that 'train_gnorm' was another run's norm). Those lines are left out, and the
    history says that fairseq's interval norms are means."""
    text, want = _fairseq_log(fmt)
    p = tmp_path / "train.log"
    p.write_text(text)
    h = read_norm_log(str(p))
    assert h.steps == sorted(want) and h.norms == [want[s] for s in sorted(want)]
    assert not any("another run" in n for n in h.notes)
    assert any("3 end-of-epoch 'train' line(s) left out" in n for n in h.notes)
    assert any("fairseq's gnorm is the mean over each logging interval" in n for n in h.notes)


def test_a_train_tag_outside_fairseq_is_read(tmp_path):
    """Only fairseq's logs (its "train_inner" lines) lose their "| train |" lines: another log that tags
    its lines so keeps them."""
    p = tmp_path / "train.log"
    p.write_text("".join(f"2024-05-01 | INFO | train | step {s} | loss 2.0 | grad norm {1 + s % 3}\n"
                         for s in range(1, 40)))
    h = read_norm_log(str(p))
    assert h.steps == list(range(1, 40)) and not any("fairseq" in n for n in h.notes)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.sampled_from(["| ", " | ", "train_inner", "train_inner | ", "| train_inner", "|", " ",
                                        "_", "x", "train", "_inner", "\u2588", "\U0001f680", "\n"]), max_size=60),
       repeat=st.sampled_from([1, 1, 70]))
@example(pieces=["train_inner | "], repeat=1)  # at the start: no "| " before it (not one from the end)
@example(pieces=["x", "train_inner | ", "| ", "x"], repeat=1)
@example(pieces=["train_inner "], repeat=70)
def test_fairseq_is_told_by_its_phrase_anywhere(pieces, repeat):
    """is_fairseq searches "train_inner" and checks each place for the rest (up to 64 places, then the
    phrase from there): true exactly when "| train_inner | " is in the text; the same of its UTF-8 bytes
    (a memory-mapped log)."""
    import mmap

    from gradtool.io.text_logs import is_fairseq

    text = "".join(pieces) * repeat
    for t in (text, text + "| train_inner | ", "train_inner x" * 65 + text,
              "train_inner x" * 64 + "| " + text):  # (the 65th place: the phrase's search from 2 before it)
        assert is_fairseq(t) == ("| train_inner | " in t), t
        assert is_fairseq(t.encode()) == is_fairseq(t), t
        if t:
            with mmap.mmap(-1, len(t.encode())) as mapped:
                mapped.write(t.encode())
                assert is_fairseq(mapped) == is_fairseq(t), t


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=80) | st.lists(st.sampled_from([b"a", b"b", b"ab", b"\x00", b"train_inner"]),
                                              max_size=20).map(b"".join),
       needle=st.binary(max_size=4) | st.sampled_from([b"ab", b"ba", b"train_inner", b"a\x00"]),
       start=st.integers(0, 90))
def test_the_compiled_find_is_bytes_find(data, needle, start):
    """_logscan.find (memmem), which is_fairseq searches a memory-mapped log with."""
    from gradtool.io.compiled import log_readers

    readers = log_readers()
    if readers is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    assert readers.find(data, needle, start) == data.find(needle, start)
    assert readers.find(bytearray(data), memoryview(needle), start) == data.find(needle, start)


def test_console_dicts_are_read_by_pattern_never_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.log"
    p.write_text("".join(f"{{'grad_norm': __import__('os').system('touch {marker}'), 'loss': {i}}}\n"
                         for i in range(30)))
    with pytest.raises(InputError):
        read_norm_log(str(p))
    assert not marker.exists()
    ok = tmp_path / "json.log"  # proper JSON Lines stay JSON Lines
    ok.write_text("".join(json.dumps({"step": i, "grad_norm": 1.5}) + "\n" for i in range(30)))
    assert read_norm_log(str(ok)).kind == "jsonl"


@pytest.mark.parametrize("style", ["torchtitan", "coloured-value", "bracketed"])
def test_text_logs_that_open_with_a_bracket_or_hold_commas_and_colours(tmp_path, style):
    """torchtitan's lines open with "[rank0]:" (taken for a JSON array: "malformed JSON"), hold commas
    ("10:00:00,000", "tps: 1,234": taken for a CSV header) and terminal colours."""
    lines = []
    for s in range(1, 61):
        g = 1 + (s % 4) / 10
        if style == "torchtitan":
            lines.append(f"[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - \x1b[31mstep: {s:2}  "
                         f"\x1b[32mloss:  {8 - s / 100:7.4f}  \x1b[38;2;180;60;0mgrad_norm: {g:7.4f}  "
                         f"\x1b[34mtps: 1,234  \x1b[35mmfu: 23.4%\x1b[39m")
        elif style == "coloured-value":
            lines.append(f"step {s} | loss \x1b[32m{8 - s / 100}\x1b[0m | grad norm: \x1b[33m{g}\x1b[0m")
        else:
            lines.append(f"[2024-01-01 10:00:{s % 60:02d},123] [INFO] [engine.py:42] step={s}, "
                         f"grad_norm={g}, loss={8 - s / 100}")
    p = tmp_path / "train.log"
    p.write_text("\n".join(lines) + "\n")
    h = read_norm_log(str(p))
    assert h.kind == "text" and h.steps == list(range(1, 61))
    assert h.norms == [1 + (s % 4) / 10 for s in range(1, 61)]
    assert h.loss[0] == pytest.approx(7.99)
    arr = tmp_path / "log.json"  # a JSON array still is one
    arr.write_text(json.dumps([{"step": s, "grad_norm": 1.0 + s} for s in range(1, 11)]))
    assert read_norm_log(str(arr)).kind == "json"
    bad = tmp_path / "bad.json"
    bad.write_text('[{"step": 1, "grad_norm": 1.0}, {"step": 2, "grad_')
    with pytest.raises(InputError, match="malformed JSON"):
        read_norm_log(str(bad))


@pytest.mark.parametrize("lead", ["\n", "\r\n \t\n\n"])
@pytest.mark.parametrize("general", [False, True])
def test_blank_lines_before_a_csvs_header_are_skipped(tmp_path, lead, general):
    """A CSV whose header comes after blank lines (a hand-made export, a log opened by an editor) was "empty
    CSV (no header)": the blank lines are skipped, as pandas' read_csv skips them, on the fast and the
    general (a column of words) paths alike."""
    body = ("phase," if general else "") + "step,grad_norm,loss\n" + "".join(
        f"{'train,' if general else ''}{i},{1 + i % 5 / 10},{3 - i / 100}\n" for i in range(1, 30))
    (tmp_path / "plain.csv").write_text(body)
    (tmp_path / "lead.csv").write_text(lead + body)
    plain, led = read_norm_log(str(tmp_path / "plain.csv")), read_norm_log(str(tmp_path / "lead.csv"))
    assert (led.steps, led.norms, led.loss, led.key) == (plain.steps, plain.norms, plain.loss, plain.key)
    assert len(led) == 29 and led.kind == "csv"


@pytest.mark.parametrize("text", ["grad_norm\n \n", "grad_norm\n\t\n", "grad_norm\n1.5\n \n2.5\n"])
def test_a_one_column_csv_with_a_line_of_blanks(tmp_path, run, text):
    """msgspec read the blank line as no number at all ("[ ]") and the table could not be shaped: a
    ValueError traceback. Found by the fast-path property test; now the general reader decides."""
    pytest.importorskip("msgspec")
    p = tmp_path / "m.csv"
    p.write_text(text)
    h = read_norm_log(str(p)) if "1.5" in text else None
    if h is not None:
        assert h.norms == [1.5, 2.5]
    else:
        r = run("suggest-threshold", str(p))
        assert r.exit_code == 1 and r.stderr == f"gradtool: error: {p}: no gradient-norm values found\n"


@pytest.mark.parametrize("step_key", ["train/global_step", "trainer/global_step"])
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_training_step_is_preferred_to_wandbs_log_counter(tmp_path, step_key, fmt):
    # A W&B history (run.history() / scan_history() saved to a file) has W&B's own counter `_step`, which
    # goes up by one per log call, next to the trainer's step (Hugging Face: train/global_step, Lightning:
    # trainer/global_step). The trainer's step is the step: it is what `.wandb` logs are read by, and only
    # it shows the logging interval (here 50: a warning that spikes between samples go unseen).
    rows = [{"_step": i, step_key: 50 * (i + 1), "train/grad_norm": 1.0 + i % 3, "train/loss": 2.0}
            for i in range(6)]
    p = tmp_path / f"history.{fmt}"
    if fmt == "csv":
        body = "".join(",".join(str(v) for v in r.values()) + "\n" for r in rows)
        p.write_text(",".join(rows[0]) + "\n" + body)
    else:
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    h = read_norm_log(str(p))
    assert h.steps == [50 * (i + 1) for i in range(6)]


def _olmo_float(v):  # olmo_core.utils.format_float, how OLMo prints metrics to the console
    return (f"{v:.2E}" if v < 0.0001 else f"{int(v):,d}" if v > 1000 else f"{v:.1f}" if v > 100
            else f"{v:.2f}" if v > 10 else f"{v:.3f}" if v > 1 else f"{v:.4f}")


def test_console_blocks_take_the_step_of_their_marker_line(tmp_path):
    # OLMo-core's console: a "[step=N/M,...]" line, then one indented metric per line; the norm line has
    # no step of its own. Read by the lines' order these were steps 0, 1, 2, ... (interval 1, no warning)
    steps, norms = [1, 10, 20, 30], [0.4212, 1234.0, 0.00005, 0.39]
    lines = []
    for s, g in zip(steps, norms, strict=True):
        lines.append(f"2025-03-01 10:00:00.123\tnode0:0\tolmo_core.train.callbacks.console_logger:78\tINFO\t"
                     f"[step={s}/3000,epoch=0,eta=1h2m]")
        lines += [f"    train/CE loss={_olmo_float(3.0 - s / 100)}", "    train/PPL=20.10",
                  f"    optim/total grad norm={_olmo_float(g)}", "    optim/step skipped=0.0000",
                  f"    optim/LR (group 0)={_olmo_float(4e-4 * s / 30)}", "    throughput/device/TPS=12,345"]
    p = tmp_path / "train.log"
    p.write_text("\n".join(lines) + "\n")
    h = read_norm_log(str(p))
    assert h.steps == steps and not h.line_order
    assert h.norms == pytest.approx([0.4212, 1234.0, 0.00005, 0.39])  # "1,234" is 1234, not 1
    assert h.loss == pytest.approx([2.99, 2.9, 2.8, 2.7])
    assert h.lr == pytest.approx([float(_olmo_float(4e-4 * s / 30)) for s in steps])


def test_composer_console_blocks(tmp_path):
    # Composer's ConsoleLogger (LLM Foundry's runs): "[batch=N/M]:" then "\t Train <name>: <value>" lines
    # (4 decimals), per-layer norms of its OptimizerMonitor before the global one, an evaluation between;
    # the per-layer norms are not the norm, and "[Eval batch=3/10]" is no training step
    steps = [10, 20, 30]
    lines = ["******************************", "Config:", "global_train_batch_size: 256",
             "max_duration: 3000ba", "******************************"]
    for s in steps:
        lines.append(f"[batch={s}/3000]:")
        lines += [f"\t Train time/batch: {s - 1}", f"\t Train loss/train/total: {3.0 - s / 100:.4f}",
                  "\t Train l2_norm/grad/model.transformer.blocks.0.norm_1.weight: 0.0100",
                  "\t Train l2_norm/moment/model.transformer.wte.weight: 0.0200",
                  f"\t Train l2_norm/grad/global: {1.0 + s / 10:.4f}",
                  f"\t Train lr-DecoupledAdamW/group0: {1e-4 * s / 30:.4f}"]
        if s == 20:
            lines += ["[Eval batch=3/10] Eval on eval data", "[Eval batch=10/10] Eval on eval data:",
                      "\t Eval metrics/eval/LanguageCrossEntropy: 2.1000"]
    p = tmp_path / "train.log"
    p.write_text("\n".join(lines) + "\n")
    h = read_norm_log(str(p))
    assert h.steps == steps and h.norms == [2.0, 3.0, 4.0] and not h.line_order and not h.notes
    assert h.loss == [2.9, 2.8, 2.7] and h.lr == [round(1e-4 * s / 30, 4) for s in steps]


def test_text_log_without_steps_says_its_steps_are_line_order(tmp_path):
    # one step number near the top ("resuming from step 5000") is no step of the norm lines after it
    p = tmp_path / "train.log"
    p.write_text("resuming from step 5000\n" + "".join(f"grad norm: {1 + i / 10}\n" for i in range(5)))
    h = read_norm_log(str(p))
    assert h.steps == [0, 1, 2, 3, 4] and h.norms[-1] == 1.4
    assert h.line_order and any("order" in n for n in h.notes)
    p.write_text("grad norm: 1.0\ngrad norm: 2.0 step 7\ngrad norm: 3.0\n")  # few with a step: line order
    h = read_norm_log(str(p))
    assert h.steps == [0, 1, 2] and h.line_order


def test_a_stray_norm_line_without_a_step_is_left_out(tmp_path):
    # a warning in a log of steps ("grad_norm is nan, skipping the update") is no observation of its own
    p = tmp_path / "train.log"
    lines = [f"step: {s}  loss: 2.0  grad_norm: {1 + s / 100}" for s in range(10, 310, 10)]
    lines.insert(12, "WARNING: grad_norm: nan, skipping the update")
    p.write_text("\n".join(lines) + "\n")
    h = read_norm_log(str(p))
    assert h.steps == list(range(10, 310, 10)) and not h.line_order
    assert any("1 of 31 gradient-norm lines have no step number and are left out" in n for n in h.notes)


@pytest.mark.parametrize(("norm", "loss", "lr"), [
    ("optim/total grad norm", "train/CE loss", "optim/LR (group 0)"),  # OLMo-core (W&B, Comet)
    ("optim/total_grad_norm", "train/CrossEntropyLoss", "optim/learning_rate_group0"),  # OLMo
])
def test_olmo_metric_names_are_found_without_key(tmp_path, norm, loss, lr):
    p = tmp_path / "history.jsonl"
    p.write_text("".join(json.dumps({"_step": i, norm: 1.0 + i, loss: 3.0 - i, lr: 1e-4 * i, "train/PPL": 20})
                         + "\n" for i in range(3)))
    h = read_norm_log(str(p))
    assert h.key == norm and h.norms == [1.0, 2.0, 3.0] and h.loss == [3.0, 2.0, 1.0]
    assert h.lr == [0.0, 1e-4, 2e-4]


def test_composers_metric_names_are_found_without_key(tmp_path):
    # what LLM Foundry logs to MLflow / W&B / JSON: OptimizerMonitor's global norm, the loss and LRMonitor's
    p = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "l2_norm/grad/model.fc.weight": 0.5, "l2_norm/grad/global": 1.0 + s,
             "loss/train/total": 3.0 - s, "lr-DecoupledAdamW/group0": 1e-4 * s} for s in (1, 2)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    h = read_norm_log(str(p))
    assert h.key == "l2_norm/grad/global" and h.norms == [2.0, 3.0] and h.loss == [2.0, 1.0]
    assert h.lr == [1e-4, 2e-4]


@pytest.mark.parametrize(("norm", "others"), [
    ("l2_norm/grad/global", ["l2_norm/grad/model.fc.weight", "l2_norm/moment/model.fc.weight"]),  # Composer
    ("grad_l2_norm/step", ["layer_grad_l2_norm/model.fc.weight"]),  # Composer's older GradMonitor
    ("l2_grads", ["l2_params", "l2_updates"]),  # big_vision's big_vision_metrics.txt
    ("grad/norm", ["grad/mean_norm", "grad/max"]),  # musubi-tuner's --log_grad_metrics (before clipping)
])
def test_other_trainers_global_norm_names_are_found_without_key(tmp_path, norm, others):
    # per-layer norms and other statistics beside them are not taken for the global norm
    p = tmp_path / "big_vision_metrics.txt"
    p.write_text("".join(json.dumps({"step": 10 * i, **{o: 50.0 for o in others}, norm: 1.0 + i,
                                     "training_loss": 3.0 - i}) + "\n" for i in range(3)))
    h = read_norm_log(str(p))
    assert h.key == norm and h.steps == [0, 10, 20] and h.norms == [1.0, 2.0, 3.0]
    assert h.loss == [3.0, 2.0, 1.0]


@pytest.mark.parametrize(("rows", "why"), [
    ([{"loss": 2.0, "learning_rate": 5e-5, "epoch": 0.1, "step": 10}], "transformers 4.38"),  # older Trainer
    ([{"current_steps": 10, "total_steps": 100, "loss": 2.0, "lr": 1e-4, "epoch": 0.1, "percentage": 10}],
     "LLaMA-Factory's trainer_log.jsonl leaves it out: read trainer_state.json beside it"),
    ([{"step": 10, "loss": 2.0}], None),
])
def test_a_log_without_a_norm_says_which_keys_it_has_and_why(tmp_path, run, rows, why):
    p = tmp_path / "trainer_log.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run("suggest-threshold", str(p))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    assert f"among its keys ({', '.join(rows[0])}); name it with --key" in r.stderr
    assert (why in r.stderr) if why else r.stderr.endswith("--key\n")


def test_the_norm_before_clipping_is_taken_over_the_clipped_one(tmp_path):
    # MaxText logs learning/grad_norm AFTER clipping (never above its threshold, 1.0 by default) and
    # learning/raw_grad_norm before it: a threshold chosen from the clipped norm would only repeat 1.0
    rows = [{"step": i, "learning/loss": 3.0, "learning/grad_norm": min(1.0, 0.5 + i),
             "learning/raw_grad_norm": 0.5 + i} for i in range(4)]
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    h = read_norm_log(str(p))
    assert h.key == "learning/raw_grad_norm" and h.norms == [0.5, 1.5, 2.5, 3.5] and h.loss == [3.0] * 4
    assert h.other_keys == [] and any("before clipping" in n for n in h.notes)
    assert read_norm_log(str(p), key="learning/grad_norm").norms == [0.5, 1.0, 1.0, 1.0]
    for pre in ("grad_norm_before_clip", "unclipped_grad_norm", "grad_norm/pre_clip"):
        p.write_text(json.dumps({"step": 1, "grad_norm_clipped": 1.0, pre: 7.0}) + "\n")
        assert read_norm_log(str(p)).norms == [7.0], pre


@pytest.mark.parametrize(("line", "norm"), [
    ("completed step: 10, seconds: 1.2, loss: 2.300, lr: 1.0e-04, grad_norm: 0.99, raw_grad_norm: 3.4", 3.4),
    ("iteration 10 | lm loss: 2.3 | clipped grad norm: 1.0 | grad norm: 3.4 |", 3.4),
    ("step: 10  loss: 2.3  grad_norm_clipped: 1.0  grad_norm: 3.4", 3.4),
    ("step: 10  loss: 2.3  grad_norm: 3.4", 3.4),
])
def test_text_lines_give_the_norm_before_clipping(tmp_path, line, norm):
    p = tmp_path / "train.log"
    p.write_text(line + "\n")
    h = read_norm_log(str(p))
    assert h.steps == [10] and h.norms == [norm] and h.loss == [2.3]


def test_text_log_names_in_any_case(tmp_path):
    # the patterns match lowercased lines; a name written in capitals, and a character whose lowercase
    # is longer ("İ" -> "i̇": the printed setting max_grad_norm was once looked for at shifted places)
    p = tmp_path / "train.log"
    p.write_text("Iteration 10 | LM Loss: 2.3 | Learning Rate: 1.0E-04 | Grad Norm: 3.4E+00 |\n"
                 "STEP: 20  LOSS: NaN  GRAD_NORM: INF\n"
                 "İİİİ step: 30 loss: 2.5 max_grad_norm=1.0 grad_norm: 0.7\n")
    h = read_norm_log(str(p))
    assert h.steps == [10, 20, 30] and h.norms == [3.4, math.inf, 0.7] and h.lr == [1e-4, None, None]
    assert h.loss[0] == 2.3 and math.isnan(h.loss[1]) and h.loss[2] == 2.5


def test_text_log_values_printed_as_pytorch_tensors(tmp_path):
    # a training loop's print("step", step, "loss", loss, "grad_norm", norm) or logging's %s prints a
    # PyTorch tensor's str(): tensor(1.2345, device='cuda:0'); those lines were left out (a history of
    # such lines only was "no 'grad norm: X' values found"), and a first line with commas in its tensors
    # was taken for a CSV header (an empty history). The strings are torch 2's, as printed
    p = tmp_path / "train.log"
    p.write_text(
        "step 10 loss tensor(2.3456, device='cuda:0', grad_fn=<NllLossBackward0>) "
        "grad_norm tensor(1.2345, device='cuda:0')\n"
        "INFO step=20 grad_norm=tensor(1.2338e-05, device='cuda:0', dtype=torch.bfloat16) lr=tensor(0.0001)\n"
        "INFO step=30 grad_norm=tensor(nan, device='cuda:0') loss=tensor(inf)\n"
        "step: 40 | grad norm: tensor(123392., dtype=torch.bfloat16) | loss: tensor(-0.5000)\n")
    h = read_norm_log(str(p))
    assert h.steps == [10, 20, 30, 40] and h.norms[:2] == [1.2345, 1.2338e-05] and h.norms[3] == 123392.0
    assert math.isnan(h.norms[2]) and h.lr == [None, 1e-4, None, None]
    assert h.loss[0] == 2.3456 and h.loss[2] == math.inf and h.loss[3] == -0.5


def test_nanogpt_and_llm_c_logs_name_the_norm_norm(tmp_path):
    # build-nanogpt's train_gpt2.py (and the loops derived from it) print "| norm: {norm:.4f} |", llm.c
    # its console "| norm %6.4f (%+.2fz)|" and its main.log "s:%d trl:%.4f lr:%.6f norm:%.2f": they were
    # "no 'grad norm: X' values found". Lines as those format strings print them
    nanogpt = ["using device: cuda", "=> calculated gradient accumulation steps: 32"] + [
        f"step {s:5d} | loss: {10.9 - s / 10:.6f} | lr {6e-4 * (s + 1) / 3:.4e} | norm: {1.5 + s:.4f} | "
        f"dt: {400.1:.2f}ms | tok/sec: {1234567.8:.2f}" for s in range(3)] + ["validation loss: 4.5000"]
    llmc = [f"step {s + 1:4d}/{74} | loss {7.5 - s:7.6f} ({0.1:+.2f}z)| norm {0.5 + s:6.4f} ({-0.2:+.2f}z)| "
            f"lr {1e-4 * (s + 1):.2e} | {300.5:.2f} ms | {1500:.0f} tok/s" for s in range(3)]
    main_log = [line for s in range(3) for line in (
        f"s:{s} trl:{7.5 - s:.4f} lr:{6e-4:.6f} norm:{0.5 + s:.2f}", f"s:{s} tel:{7.9:.4f}")]
    for name, lines, steps, norms, loss, lr in [
            ("nanogpt.log", nanogpt, [0, 1, 2], [1.5, 2.5, 3.5], [10.9, 10.8, 10.7], [2e-4, 4e-4, 6e-4]),
            ("llmc.log", llmc, [1, 2, 3], [0.5, 1.5, 2.5], [7.5, 6.5, 5.5], [1e-4, 2e-4, 3e-4]),
            ("main.log", main_log, [0, 1, 2], [0.5, 1.5, 2.5], [7.5, 6.5, 5.5], [6e-4] * 3)]:
        p = tmp_path / name
        p.write_text("\n".join(lines) + "\n")
        h = read_norm_log(str(p))
        assert (h.steps, h.norms, h.key) == (steps, norms, "norm")
        assert h.loss == pytest.approx(loss) and h.lr == pytest.approx(lr)
        assert any("read from 'norm'" in n for n in h.notes) and not h.line_order


def test_mmengine_logs_by_epoch_and_by_iteration(tmp_path):
    # OpenMMLab's MMEngine (mmdet, mmseg, ...) logs "Epoch(train)  [2][ 50/270]  lr: ...  grad_norm: ..."
    # (the iteration within the epoch) or "Iter(train) [ 50/1000]  ..." when it trains by iterations: no
    # step word, so the steps were the lines' order. Lines as its LogProcessor writes them
    head = "2024/05/01 10:00:00 - mmengine - INFO - "
    by_epoch = [f"{head}Epoch(train)  [{e}][{i:3d}/270]  base_lr: 1.0000e-04 lr: 1.0000e-04  eta: 1:02:03  "
                f"time: 0.3012  data_time: 0.0101  memory: 5210  grad_norm: {g:.4f}  loss: {lo:.4f}  "
                f"loss_cls: 0.5000"
                for e, i, g, lo in [(1, 50, 3.5, 2.1), (1, 100, 2.5, 1.9), (2, 50, 1.5, 1.7)]]
    by_epoch.insert(2, f"{head}Epoch(val)  [1][ 50/500]    eta: 0:01:00  time: 0.1000  data_time: 0.0100")
    by_iter = [f"{head}Iter(train) [{i:4d}/1000]  lr: 2.0000e-02  eta: 0:10:00  time: 0.5000  "
               f"data_time: 0.0100  memory: 3000  grad_norm: {g}  loss: 1.0000"
               for i, g in [(50, 0.5), (100, 0.7)]]
    for lines, steps, norms in [(by_epoch, [50, 100, 320], [3.5, 2.5, 1.5]),
                                (by_iter, [50, 100], [0.5, 0.7])]:
        p = tmp_path / "20240501_100000.log"
        p.write_text("\n".join(lines) + "\n")
        h = read_norm_log(str(p))
        assert (h.steps, h.norms, h.line_order) == (steps, norms, False)
    assert h.loss == [1.0, 1.0] and h.lr == [0.02, 0.02]


def test_nanogpt_iter_lines_give_their_step(tmp_path):
    # nanoGPT's train.py prints "iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu ..."; with a
    # norm added to it, "iter" was no step word and the steps were the lines' order
    p = tmp_path / "train.log"
    p.write_text("".join(f"iter {i}: loss {4.2 - i / 100:.4f}, time {95.5:.2f}ms, mfu {31.2:.2f}%, "
                         f"grad_norm {0.5 + i / 100:.4f}\n" for i in range(0, 50, 10)))
    h = read_norm_log(str(p))
    assert h.steps == [0, 10, 20, 30, 40] and h.norms == [0.5, 0.6, 0.7, 0.8, 0.9] and not h.line_order
    assert h.loss == pytest.approx([4.2, 4.1, 4.0, 3.9, 3.8])


@pytest.mark.parametrize("text, norms", [
    ("step 1 | param norm: 5.0 | norm: 2.0 | grad norm: 1.0\n", [1.0]),  # a gradient norm's name wins
    ("step 1 | param norm: 5.0 | layer_norm: 3.0 | max norm 1.0 | norm_ratio: 0.5\n", None),  # no norm
])
def test_a_norm_named_norm_is_read_only_without_a_gradient_norm(tmp_path, text, norms):
    p = tmp_path / "train.log"
    p.write_text(text)
    if norms is None:
        with pytest.raises(InputError, match="no 'grad norm: X' values"):
            read_norm_log(str(p))
    else:
        h = read_norm_log(str(p))
        assert h.norms == norms and h.key == "grad_norm" and not h.notes


_finite = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(records=st.lists(st.tuples(st.integers(1, 10**9), _finite, st.one_of(st.none(), _finite),
                                  st.one_of(st.none(), _finite)), min_size=1, max_size=20,
                        unique_by=lambda r: r[0]),
       blocks=st.booleans(), noise=st.booleans())
def test_text_log_reads_back_what_was_printed(records, blocks, noise):
    # Megatron's one line per step, or OLMo's block under a step line, with noise lines between: the
    # steps, norms, losses and learning rates printed (repr: exact) are the ones read, in step order
    from gradtool.io.text_logs import read_text_log

    out = []
    for step, norm, loss, lr in sorted(records):  # in step order, as a training prints them
        loss_text = "" if loss is None else f"lm loss: {loss!r}"
        lr_text = "" if lr is None else f"learning rate: {lr!r}"
        if blocks:
            out += [f"[step={step}/?,epoch=0]", f"    {loss_text}", f"    grad norm={norm!r}",
                    f"    {lr_text}"]
        else:
            out.append(f" iteration {step:8d}/ 99 | {lr_text} | {loss_text} | grad norm: {norm!r} |")
        if noise:
            out.append("saving checkpoint took 1.5 s")
    h = read_text_log("x.log", text="\n".join(out) + "\n")
    want = sorted(records)
    assert h.steps == [r[0] for r in want] and h.norms == [r[1] for r in want]
    assert h.loss == [r[2] for r in want] and h.lr == [r[3] for r in want] and not h.line_order


_TEXT_NAMES = ["step", "iteration", "iter", "s", "global_step", "num_updates", "[step=", " [batch=",
               "[batch=", "epoch(train)  [2][", "iter(train) [", "grad norm", "grad_norm", "gradnorm",
               "gnorm", "total_norm", "l2_norm/grad/global", "max_grad_norm", "max grad_norm",
               "clipped grad_norm", "raw grad norm", "norm before clip", "norm", "| norm", "lm loss", "loss",
               "trl", "loss/train/total", "lr", "lr-adamw/group0", "learning rate", "learning rate (1e-4)"]
_TEXT_FIELD = st.tuples(st.sampled_from(_TEXT_NAMES), st.sampled_from(["", " ", ":", ": ", "=", '": ']),
                        st.sampled_from(["12", "3.5e-04", "nan", "inf", "1,234", "7/99]", "7/99]:", "x"]))
_TEXT_PIECES = st.one_of(_TEXT_FIELD.map("".join), st.sampled_from([" ", " | ", "\t", "x", "ab", "]:"]))


@settings(max_examples=500, deadline=None)
@given(lines=st.lists(st.lists(_TEXT_PIECES, max_size=8).map("".join), max_size=6))
@example(lines=["x [batch=7/99]:", "x total_norm: 3", "x global_step 5", "num_updates12step12",
                "s:3 trl:2.5", "epoch(train)  [2][ 50/270]", "iter(train) [ 50/1000]"])
def test_text_log_word_checks_skip_only_lines_the_patterns_cannot_match(lines):
    # the text reader runs a pattern on a line only if the line holds one of the pattern's words: 2-3x
    # faster on logs full of other lines; the matches are those of every pattern on every line
    from gradtool.io import text_logs

    def same(a, b):
        return (a and (a.re, a.span())) == (b and (b.re, b.span()))

    for line in lines:
        step = (text_logs._TEXT_STEP.search(line) or text_logs._MMENGINE_STEP.search(line)
                or text_logs._LLMC_STEP.match(line) or text_logs._BATCH_HEADER.search(line))
        if step is not None and step.re is text_logs._MMENGINE_STEP:
            epoch, i, per_epoch, it = step.groups()
            want = int(it) if it else (int(epoch) - 1) * int(per_epoch) + int(i)
            assert text_logs._text_step(line, True) == want
        else:
            assert text_logs._text_step(line, True) == (step and int(step.group(1)))
        if "norm" not in line:  # the reader's check before _text_norm
            assert text_logs._TEXT_NORM.search(line) is None
            assert text_logs._TEXT_NORM_NAMED.search(line) is None
            assert text_logs._BARE_NORM.search(line) is None
        record: dict = {}
        text_logs._text_loss_and_lr(record, line, True)
        lo = text_logs._TEXT_LOSS.search(line) or (
            text_logs._LLMC_LOSS.search(line) if line.startswith("s:") else None)
        lr = text_logs._TEXT_LR.search(line)
        assert repr(record.get("loss")) == repr(lo and float(lo.group(1).replace(",", "")))  # nan == nan
        assert repr(record.get("learning_rate")) == repr(lr and float(lr.group(1).replace(",", "")))


def test_nemo_dllogger_lines(tmp_path):
    # NeMo 2's DLLogger (NVIDIA's DeepLearningExamples too): "DLLL " and a JSON object per line, the
    # metrics in its "data"; the names are quoted, which the text patterns did not allow for
    p = tmp_path / "dllogger.json"
    lines = ["DLLL " + json.dumps({"timestamp": "1", "type": "PARAMETER", "data": {"config": "x"}})]
    lines += ["DLLL " + json.dumps({"timestamp": "1741985729.87", "elapsedtime": "1875.7", "type": "LOG",
                                    "step": s, "data": {"reduced_train_loss": 12.5 - s, "lr": 1e-6 * s,
                                                        "global_step": float(s), "grad_norm": 45.5 + s,
                                                        "train_step_timing in s": 118.1}})
              for s in (10, 20, 30)]
    p.write_text("\n".join(lines) + "\n")
    h = read_norm_log(str(p))
    assert h.steps == [10, 20, 30] and h.norms == [55.5, 65.5, 75.5] and h.loss == [2.5, -7.5, -17.5]
    assert h.lr == pytest.approx([1e-5, 2e-5, 3e-5])


def test_a_downsampled_wandb_chart_export_is_said_to_average_spikes_away(tmp_path, run):
    # W&B's chart export of a run with more points than the chart shows: each row is a bucket of steps,
    # its value their mean and __MIN/__MAX their range. A spike inside a bucket is averaged away
    col = "my-run - train/grad_norm"
    rows = [f"{10 * i},{1.0 + i % 3},{0.9 + i % 3},{1.1 + i % 3 + (5 if i == 30 else 0)}" for i in range(60)]
    p = tmp_path / "wandb_export.csv"
    p.write_text(f"Step,{col},{col}__MIN,{col}__MAX\n" + "\n".join(rows) + "\n")
    h = read_norm_log(str(p))
    assert h.key == col and any("mean of several logged steps" in n for n in h.notes)
    r = run("suggest-threshold", str(p), "--format", "json")
    assert r.exit_code == 0 and any("__MAX" in w for w in json.loads(r.stdout)["history"]["warnings"])
    # every row one step (MIN == MAX == the value): no note
    p.write_text(f"Step,{col},{col}__MIN,{col}__MAX\n"
                 + "".join(f"{i},{1.0 + i % 3},{1.0 + i % 3},{1.0 + i % 3}\n" for i in range(60)))
    assert not read_norm_log(str(p)).notes
    p.write_text(f"Step,{col},{col}__MIN,{col}__MAX\n1,nan,nan,nan\n2,1.0,1.0,1.0\n3,,,\n")
    assert not read_norm_log(str(p)).notes  # a NaN step, an empty row: no bucket


def _two_trainings(first, second):
    """Records of two trainings appended to one log: steps 10, 20, ... each, norms 1.x then 5.x."""
    return ([{"step": 10 * (i + 1), "grad_norm": 1.0 + i / 100, "loss": 2.0} for i in range(first)]
            + [{"step": 10 * (i + 1), "grad_norm": 5.0 + i / 100, "loss": 3.0} for i in range(second)])


@pytest.mark.parametrize("how", ["jsonl", "jsonl-general", "csv", "csv-general", "text"])
def test_a_log_of_two_trainings_is_read_as_its_last(tmp_path, how):
    # `python train.py >> train.log` twice, or a tracker's run name used again (the Trainer's default
    # name is its output directory): the second training's steps start over. Merged by step, the longer
    # first training's tail (steps 210..300 here) was read as if the second had logged it
    recs = _two_trainings(30, 20)
    if how == "jsonl-general":  # a string in a column sends the reader to its general loop
        recs[0]["note"] = "x"
        recs[0]["loss"] = "2.0"
    name = "log.jsonl" if how.startswith("jsonl") else "log.csv" if how.startswith("csv") else "train.log"
    p = tmp_path / name
    if how.startswith("jsonl"):
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    elif how.startswith("csv"):
        body = "".join(f"{r['step']},{r['grad_norm']},{r['loss']}\n" for r in recs)
        p.write_text("step,grad_norm,loss\n" + body + ("10,,\n" if how == "csv-general" else ""))
    else:
        p.write_text("".join(f"step: {r['step']}  loss: {r['loss']}  grad_norm: {r['grad_norm']}\n"
                             for r in recs))
    h = read_norm_log(str(p))
    assert h.steps == [10 * (i + 1) for i in range(20)] and h.norms[0] == 5.0 and h.norms[-1] == 5.19
    assert any("start over 1 time(s) (last at step 300 then 10): it holds 2 trainings" in n
               and "(20 of 50 values)" in n for n in h.notes), h.notes


def test_a_resumed_run_in_one_log_is_merged_and_said_so(tmp_path, run):
    # resumed from the checkpoint at step 200 after a crash at step 250: steps 210..250 logged twice
    recs = ([{"step": s, "grad_norm": 1.0, "loss": 2.0} for s in range(10, 260, 10)]
            + [{"step": s, "grad_norm": 2.0, "loss": 2.0} for s in range(210, 410, 10)])
    p = tmp_path / "log.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    h = read_norm_log(str(p))
    assert h.steps == list(range(10, 410, 10)) and h.norms[19] == 1.0 and h.norms[20:] == [2.0] * 20
    assert any("go back 1 time(s) (at step 250 then 210: a run resumed" in n for n in h.notes), h.notes
    r = run("suggest-threshold", str(p), "--format", "json")
    assert any("a run resumed from a checkpoint" in w for w in r.json()["history"]["warnings"])


def test_a_runs_checkpoints_are_merged_without_a_word_of_trainings(tmp_path):
    # each checkpoint's trainer_state.json repeats the history from step 0: one training, merged on purpose
    out = tmp_path / "output"
    for ck in (100, 200):
        (out / f"checkpoint-{ck}").mkdir(parents=True)
        hist = [{"step": s, "grad_norm": 1.0 + s / 1000, "loss": 2.0} for s in range(10, ck + 10, 10)]
        (out / f"checkpoint-{ck}" / "trainer_state.json").write_text(json.dumps({"log_history": hist}))
    h = read_norm_log(str(out))
    assert h.steps == list(range(10, 210, 10)) and not h.notes


@pytest.mark.parametrize(("norm", "loss", "lr"), [("grad-norm", "lm loss", "learning-rate"),  # Megatron TB
                                                  ("learning/raw_grad_norm", "learning/loss",
                                                   "learning/current_learning_rate")])  # MaxText
def test_megatron_and_maxtext_learning_rates_are_found(tmp_path, norm, loss, lr):
    # the learning rate is how a warm-up is found (the observations before it ends are skipped)
    p = tmp_path / "scalars.jsonl"
    p.write_text("".join(json.dumps({"step": s, norm: 1.0, loss: 2.0, lr: 1e-4 * min(s, 10) / 10}) + "\n"
                         for s in range(1, 31)))
    h = read_norm_log(str(p))
    assert h.key == norm and h.loss[0] == 2.0 and h.lr[0] == pytest.approx(1e-5)


def test_a_printed_max_grad_norm_setting_is_no_norm_value(tmp_path):
    # the Trainer prints its TrainingArguments (max_grad_norm=1.0, ...) at start: a limit, not a norm; read
    # as one it was a norm line without a step, and every step became the lines' order
    p = tmp_path / "train.log"
    p.write_text("TrainingArguments(learning_rate=5e-05, max_grad_norm=1.0, max-grad-norm 1.0, "
                 "max_steps=30)\n"
                 + "".join(f"step: {s}  loss: 2.0  grad_norm: {1 + s / 100}\n" for s in range(10, 310, 10)))
    h = read_norm_log(str(p))
    assert h.steps == list(range(10, 310, 10)) and not h.line_order and not h.notes
    p.write_text("clip: max_grad_norm=1.0 | step 10 | raw_grad_norm: 3.0\n")
    assert read_norm_log(str(p)).norms == [3.0]


def test_trainer_console_logs_of_two_trainings_are_told_apart_by_their_epoch(tmp_path):
    # `python train.py 2>&1 | tee -a train.log` twice: the Trainer's lines give no step, but an epoch
    # that starts over
    def lines(n, g):
        return "".join(f"{{'loss': 2.0, 'grad_norm': {g}, 'learning_rate': 5e-05, "
                       f"'epoch': {(i + 1) / 100}}}\n" for i in range(n))

    p = tmp_path / "train.log"
    p.write_text(lines(40, 1.0) + "{'train_runtime': 12.3, 'epoch': 0.4}\n" + lines(30, 3.0))
    h = read_norm_log(str(p))
    assert h.kind == "console" and h.line_order and len(h) == 30 and set(h.norms) == {3.0}
    assert any("its epochs start over 1 time(s) (last at epoch 0.4 then 0.01): it holds 2 trainings" in n
               for n in h.notes), h.notes
    p.write_text(lines(40, 1.0))  # one training: as before
    assert len(read_norm_log(str(p))) == 40 and len(read_norm_log(str(p)).notes) == 1


@pytest.mark.skipif(not REAL_FILES, reason="../shared/real-logs not present")
@pytest.mark.parametrize("name", REAL_FILES)
def test_real_trainer_logs_printed_to_the_console_read_as_one_training(tmp_path, name):
    # the real logs' entries as the Trainer prints them (a dict a line, no step): their epochs never start
    # over, so every norm is read, none taken for a second training
    with open(os.path.join(REAL, name)) as f:
        entries = json.load(f)["log_history"]
    p = tmp_path / "console.log"
    p.write_text("".join(repr({k: v for k, v in e.items() if k != "step"}) + "\n" for e in entries))
    h = read_norm_log(str(p))
    assert h.kind == "console" and h.norms == [e["grad_norm"] for e in entries if "grad_norm" in e]
    assert len(h.notes) == 1 and "gives no step numbers" in h.notes[0]


def test_lightning_step_and_epoch_suffixes(tmp_path, run):
    """self.log(..., on_step=True, on_epoch=True) names the metric NAME_step at each step and NAME_epoch (a
    mean) at each epoch's end: grad_2.0_norm_total_step was "no gradient-norm key", and beside
    grad_norm_step its epoch mean grad_norm_epoch was called another run's norm."""
    for total in ("grad_2.0_norm_total", "grad_norm"):
        p = tmp_path / f"{total}.csv"
        rows = [f"epoch,step,train_loss_step,{total}_step,{total}_epoch,train_loss_epoch"]
        for s in range(60):
            rows.append(f"0,{s},{2 - s / 100},{1 + s % 4 / 10},,")
            if s % 20 == 19:
                rows.append(f"0,{s},,,1.15,1.8")
        p.write_text("\n".join(rows) + "\n")
        h = read_norm_log(str(p))
        assert h.key == f"{total}_step" and h.steps == list(range(60)), total
        assert h.norms == [1 + s % 4 / 10 for s in range(60)] and h.loss[5] == 2 - 5 / 100
        r = run("suggest-threshold", str(p), "--format", "json")
        assert r.exit_code == 0, r.stderr
        assert not any("holds a gradient norm too" in w for w in r.json()["history"]["warnings"]), total


def test_a_lightning_csv_logger_directory(tmp_path, run):
    """CSVLogger writes lightning_logs/version_N/metrics.csv (and hparams.yaml): the version directory,
    like TensorBoard's, was "directory holds no gradient dumps, trainer_state.json, ...". It is a run."""
    logs = tmp_path / "lightning_logs"
    for v, scale in ((0, 1.0), (1, 2.0)):
        d = logs / f"version_{v}"
        d.mkdir(parents=True)
        (d / "hparams.yaml").write_text("lr: 0.001\n")
        (d / "metrics.csv").write_text("epoch,step,train_loss,grad_2.0_norm_total\n" + "".join(
            f"0,{s},{2 - s / 100},{scale * (1 + s % 5 / 10)}\n" for s in range(60)))
    one = run("suggest-threshold", str(logs / "version_1"), "--format", "json")
    assert one.exit_code == 0, one.stderr
    assert one.json()["source"]["kind"] == "csv" and one.json()["history"]["n"] == 60
    both = run("suggest-threshold", str(logs))
    assert both.exit_code == 2
    assert re.search(r"holds 2 Lightning CSV runs \('version_1' \(.*UTC\), 'version_0' \(.*UTC\)\); "
                     "choose one with --run", both.stderr), both.stderr  # newest first
    chosen = run("suggest-threshold", str(tmp_path), "--run", "lightning_logs/version_0", "--format", "json")
    assert chosen.exit_code == 0, chosen.stderr
    assert chosen.json()["source"]["run"]["name"] == "lightning_logs/version_0"
    h = read_norm_log(str(logs), run="latest")
    assert h.kind == "csv" and h.norms[:2] == [2.0 * 1.0, 2.0 * 1.1]  # version_1, written last
    if importlib.util.find_spec("tensorboard") is not None:  # both loggers writing into one version_N/
        _tb_events(logs / "version_0", list(range(1, 21)))
        h = read_norm_log(str(logs), run="version_0")
        assert h.kind == "tensorboard" and h.steps == list(range(1, 21))
    r = run("stats", str(logs / "version_1"))
    assert r.exit_code == 1
    assert "it holds training logs (Lightning's metrics.csv): suggest-threshold reads" in r.stderr


_norm_line_piece = st.sampled_from(["grad norm", "grad_norm", "grad-norm", "gradnorm", "gnorm", "total_norm",
                                    "l2_norm/grad/global", "norm", "no", "rm", "grad", "total", "l2_", "max_",
                                    " ", ": ", "=", " | ", "1.5", "nan", "inf", "tensor(", "'", "2,345", "e-3"])


@given(st.lists(_norm_line_piece, max_size=14).map("".join))
@example("total_norm: 1.0 | grad norm: 2")
@example("l2_norm/grad/global: 0.5")
def test_the_norm_pattern_searched_from_before_the_first_norm_finds_what_a_full_search_finds(line):
    """_text_norm starts its search _NORM_WORD_AT characters before the line's first "norm": the same
    match (or none) as searching from the start, whatever the names around it."""
    from gradtool.io.text_logs import _NORM_WORD_AT, _TEXT_NORM

    full = _TEXT_NORM.search(line)
    short = _TEXT_NORM.search(line, max(0, line.find("norm") - _NORM_WORD_AT))
    assert (full and (full.span(), full.groups())) == (short and (short.span(), short.groups()))


# ---- text lines read by a template of the line (text_logs._LineTemplate) ----------------------------------
_TEMPLATE_NAMES = ["iteration", "step", "iter", "global_step", "grad norm", "grad_norm", "gnorm",
                   "total_norm", "l2_norm/grad/global", "lm loss", "loss", "loss scale", "learning rate",
                   "lr", "lr-adamw/group0", "consumed samples", "elapsed time per iteration (ms)",
                   "max_grad_norm", "clipped grad norm", "tokens", "epoch", "fp16", "tensor(", "e"]
_TEMPLATE_SEPARATORS = [" | ", "  ", " ", ", ", "|", " |", ",", "] [", "/ "]
_TEMPLATE_VALUES = st.one_of(
    st.integers(-10**7, 10**7).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.floats(min_value=-1e9, max_value=1e9).map(lambda v: f"{v:.3e}"),
    st.floats(min_value=0, max_value=1e7).map(lambda v: f"{v:,.0f}"),
    st.sampled_from(["nan", "inf", "-inf", "infinity", "NaN", "1.", ".5", "1.2.3", "1e", "-", "x", "", "0012",
                     "+3", "1,23", "12,345,6", "1e5x", "5e-3", "2E+04", "1,234", "\u0661\u0662", "3\u0663",
                     "1" * 19, "9" * 130, "0.1e+", "infinit", "nanx", "+nan", "-0"]))


@st.composite
def _template_logs(draw):
    """A log of lines printed from one format (names, separators; a number per field, padded to a width
    or not), with some lines of another format or none among them."""
    fields = draw(st.lists(st.tuples(st.sampled_from(_TEMPLATE_NAMES),
                                     st.sampled_from(["", ": ", "=", " ", ":"]), st.integers(0, 9)),
                           min_size=1, max_size=7))
    seps = draw(st.lists(st.sampled_from(_TEMPLATE_SEPARATORS), min_size=len(fields), max_size=len(fields)))
    lead = draw(st.sampled_from(["", " ", "[rank0]: "]))
    lines = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["format"] * 6 + ["other", "step line", "blank"]))
        if kind == "format":
            values = draw(st.lists(_TEMPLATE_VALUES, min_size=len(fields), max_size=len(fields)))
            pads = draw(st.lists(st.booleans(), min_size=len(fields), max_size=len(fields)))
            lines.append(lead + "".join(f"{n}{i}{v.rjust(w) if pad else v}{sep}" for (n, i, w), v, pad, sep
                                        in zip(fields, values, pads, seps)))
        elif kind == "other":
            lines.append(draw(st.sampled_from(["grad norm: 2.5", "step 3 loss 1.0", "saving checkpoint",
                                               "iteration 7 | grad norm: nan |", "lm loss: 4.5"])))
        elif kind == "step line":
            lines.append(f"[step={draw(st.integers(0, 99))}/99]")
        else:
            lines.append("")
        if draw(st.integers(0, 9)) == 0:  # a line in capitals, or with a character that is not ASCII
            lines[-1] = draw(st.sampled_from([lines[-1].upper(), lines[-1] + " \u00e9", "\u2588" + lines[-1],
                                              lines[-1].replace("e", "\u0130"), "\U0001f600 " + lines[-1],
                                              lines[-1].replace("r", "\u03a3"), "\u00c9\u2160 " + lines[-1],
                                              lines[-1].replace(" ", "\u0391\u00df ")]))
    # lines end as str.splitlines() ends them; mostly "\n"
    breaks = draw(st.lists(st.sampled_from(["\n"] * 12 + ["\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d",
                                                           "\x1e", "\x85", "\u2028", "\u2029", "\n\r"]),
                           min_size=len(lines), max_size=len(lines)))
    return "".join(line + brk for line, brk in zip(lines, breaks))


def _text_outcome(text):
    from gradtool.io.text_logs import read_text_log

    try:
        h = read_text_log("x.log", text=text)
    except (InputError, UsageError) as exc:
        return type(exc), str(exc)
    return (h.steps, [repr(v) for v in h.norms], [repr(v) for v in h.loss], [repr(v) for v in h.lr], h.key,
            h.kind, h.line_order, h.other_keys, h.notes)


@settings(max_examples=400, deadline=None)
@given(_template_logs())
@example(" iteration        1/      10 | lm loss: 2.000000E+00 | grad norm: 1.038 |\n"
         " iteration       10/      10 | lm loss: 1.900000E+00 | grad norm: nan |\n"
         " iteration       11/      10 | lm loss: 1.900000E+00 | grad norm: infinity |\n")
@example("step 1, tokens 12,345 , grad_norm 1.5\nstep 2, tokens 1 ,2 , grad_norm 1.5\n")
@example("step 1 | loss 1,23 | grad norm: 1\nstep 2 | loss 12,345 | grad norm: 1\n")  # 1 then 12345
@example("step 1 | lr-adamw/group0: 1e-4 | grad norm: 1\nstep 2 | lr-adamw/group1: 1e-4 | grad norm: 2\n")
@example("loss=2.5, grad_norm=1.0\nloss=2.5, grad_norm=1.1\n[step=5/99]\nlm loss: 9.0\n"
         "loss=2.5, grad_norm=1.2\nloss=2.5, grad_norm=1.3\n")  # no step: the one after a step line is its
@example("iter 1 | grad norm: 1.5\n\u0130ter 2 | grad norm: 2.5\niter 3 | grad norm: 3.5\n")  # "i\u0307"
@example("".join(f"step {i} | loss: 2.5 | grad norm: 1.{i}\n" for i in range(40)) +
         "".join(f"step {i} | grad norm: 2.{i}\n" for i in range(40, 80)))  # templates of other fields
@example("".join(f"step {i} | grad norm: 2.{i}\n" for i in range(40)) +
         "".join(f"step {i} | loss: 2.5 | grad norm: 1.{i}\n" for i in range(40, 80)))
def test_lines_read_by_a_template_are_read_as_the_patterns_read_them(text):
    """A line of the same text as an earlier norm line's, but for its numbers, is read by one match of
    a template made from that line (by the compiled reader, gradtool/io/_logscan.c's template_text, or
    the template's pattern): the history (steps, norms, loss, learning rate, notes) is the one the
    patterns give line by line, whatever the numbers (signs, exponents, thousands commas, nan, inf,
    padding, digits of other scripts, long ones), the other lines among them, their case, line breaks
    and characters that are not ASCII; lines with a step or without one (a template of those too)."""
    from gradtool.io import text_logs

    fast = _text_outcome(text)  # by the compiled reader of templates, when it is built
    with pytest.MonkeyPatch.context() as m:
        m.setattr(text_logs, "_template_text", lambda: None)
        by_pattern = _text_outcome(text)  # by the template's pattern
        m.setattr(text_logs._RunSink, "RUN_ROWS", 1)
        by_runs = _text_outcome(text)  # by the template's pattern, every window's numbers kept as arrays
        m.setattr(text_logs._LineTemplate, "of", classmethod(lambda cls, line, match: None))
        slow = _text_outcome(text)
    plain = _text_outcome("\n".join(text.lower().splitlines()))  # lines split and lowered by Python
    assert fast == by_pattern == by_runs == slow == plain


def test_a_megatron_log_is_read_by_its_template(monkeypatch):
    """The lines of a Megatron log are read by one template (the first line's): no line goes to the
    patterns after the first, a NaN norm included."""
    from gradtool.io import text_logs

    lines = [f" iteration {i:8d}/ 1000 | consumed samples: {8 * i} | learning rate: 1.000E-04 | lm loss: "
             f"{2 + 1 / i:.6E} | loss scale: 1.0 | grad norm: {'nan' if i == 7 else f'{1 + i / 100:.3f}'} |"
             for i in range(1, 1001)]
    calls = []
    norm = text_logs._text_norm
    monkeypatch.setattr(text_logs, "_text_norm", lambda line: calls.append(line) or norm(line))
    h = text_logs.read_text_log("x.log", text="\n".join(lines))
    assert len(calls) == 1 and h.steps == list(range(1, 1001)) and math.isnan(h.norms[6])
    assert h.norms[:2] == [1.01, 1.02] and h.loss[0] == 3.0 and h.lr == [1e-4] * 1000


@pytest.mark.parametrize("bar", ["#", "\u2588"])
def test_tqdm_updates_without_steps_are_read_by_templates(monkeypatch, bar):
    """A custom loop's tqdm updates (``set_postfix(loss=..., grad_norm=...)``, no step numbers) are read by
    templates of lines without a step (they went to the patterns a line at a time: 10^6 in ~4.6 s), a new
    one soon after the bar grows a block (a template that stopped reading was kept until it had been
    tried on twice the lines it read): the history of the lines' order, as the patterns read it."""
    from gradtool.io import text_logs

    n = 3000
    text = "".join(f"\rEpoch 0: {100 * (i + 1) // n:3d}%|{(bar * (10 * (i + 1) // n)).ljust(10)}| {i + 1}/{n} "
                   f"[00:{i % 60:02d}<12:34,  9.87it/s, loss={2.5 - i / n:.3f}, grad_norm={1 + i % 7 / 10:.3f}]"
                   for i in range(n)) + "\n"
    calls = []
    norm = text_logs._text_norm
    monkeypatch.setattr(text_logs, "_text_norm", lambda line: calls.append(line) or norm(line))
    h = text_logs.read_text_log("x.log", text=text)
    # the first line, whose template (its bar all spaces: no bar, fixed text) reads no more at the bar's
    # first block; 17 lines to the patterns, then one template for every state of the bar (it was up to
    # 18 a block of the bar)
    assert len(calls) <= 18
    assert h.line_order and h.steps == list(range(n)) and h.norms == [1 + i % 7 / 10 for i in range(n)]
    assert h.loss == [float(f"{2.5 - i / n:.3f}") for i in range(n)] and "no step number" in h.notes[-1]
    monkeypatch.setattr(text_logs._LineTemplate, "of", classmethod(lambda cls, line, match: None))
    slow = text_logs.read_text_log("x.log", text=text)
    assert (slow.steps, slow.norms, slow.loss, slow.notes) == (h.steps, h.norms, h.loss, h.notes)


_RUN_ROW = " iteration {:8d}/ 1000 | lm loss: {:.6E} | grad norm: {} |"


def _run_template(row=_RUN_ROW):
    from gradtool.io import text_logs

    first = row.format(1, 2.0, "1.0").lower()
    return text_logs._LineTemplate.of(first, text_logs._text_norm(first))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["line"] * 4 + ["upper", "other", "nan", "dotted"]), min_size=1, max_size=40),
       st.integers(1, 400), st.integers(1, 900), st.booleans(), st.sampled_from(["", " \u2502", " \u00e9"]))
@example(["line"] * 30 + ["other", "line"], 1, 1, True, "")
@example(["line"] * 3 + ["dotted", "line"], 1, 1, True, " \u2502")
def test_a_template_run_reads_the_lines_it_matches_whatever_its_windows(kinds, first, window, end_break, mark):
    """_LineTemplate.run reads the lines from a position on that its pattern matches whole (lowercased),
    each one's groups in order, and gives where the first other line starts (or the text's end), whatever
    sizes its windows of the text start from and grow to (a window of whole lines, doubling while every
    line of it matched); lines of characters that are not ASCII too (``mark``), but for a window holding
    one that lowercasing makes two (a dotted capital I), where the run ends, before that window."""
    row = _RUN_ROW + mark
    template = _run_template(row)
    lines = [row.format(i, 2 + 1 / i, f"{1 + i / 100:.3f}") if kind in ("line", "upper", "dotted") else
             row.format(i, 2.0, "nan") if kind == "nan" else "saving checkpoint"
             for i, kind in enumerate(kinds, 1)]
    lines = [line.upper() if kind == "upper" else line + " \u0130" if kind == "dotted" else line
             for line, kind in zip(lines, kinds)]
    text = "\n".join(lines) + ("\n" if end_break else "")
    for start in (0, len(lines[0]) + 1):  # from the first line, and from the second
        if start > len(text):
            continue
        want, resume = [], start
        for line in text[start:].splitlines(keepends=True):
            if (m := template.pattern.fullmatch(line.rstrip("\n").lower())) is None:
                break
            want.append(m.groups())
            resume += len(line)
        assert len(want) == next((i for i, k in enumerate(kinds) if k in ("other", "dotted")
                                  and i >= (start > 0)), len(kinds)) - (start > 0)
        got, pos = template.run(text, start, window=window, first=first)
        read = lines[(start > 0):(start > 0) + len(got)]
        assert got == want[:len(got)] and pos == min(len(text), start + sum(len(line) + 1 for line in read))
        if "\u0130" not in text:
            assert (got, pos) == (want, resume)
        elif got != want:  # a window of the run's lines holds a dotted I: the run ends before it
            assert "\u0130" in text[pos:pos + 2 * max(first, window) + 200]


@pytest.mark.parametrize("row, compiled", [(_RUN_ROW + " \u03a3", True), (_RUN_ROW + " \u2502", False),
                                           (" step {:d}, loss {}, grad norm: {}", False)])
def test_lines_the_compiled_template_does_not_read_are_read_a_run_at_a_time(monkeypatch, row, compiled):
    """Lines the compiled reader leaves to Python (a capital sigma: str.lower() lowers it by its place in
    a word), and any lines without the compiled reader, are read by the template's pattern a run of
    lines at a time (_LineTemplate.run): not a fullmatch and the reader's Python a line."""
    from gradtool.io import text_logs

    if not compiled:
        monkeypatch.setenv("GRADTOOL_NO_KERNELS", "1")

    read = []
    run = text_logs._LineTemplate.run

    def counted(self, *a, sink=None, **k):  # the rows run hands its sink (or gives back)
        got = run(self, *a, sink=None if sink is None else lambda rows: read.append(len(rows)) or sink(rows), **k)
        read.append(len(got[0]))
        return got

    monkeypatch.setattr(text_logs._LineTemplate, "run", counted)
    text = "".join(row.format(i, 2.0 + i % 5, f"{1 + i / 100:.3f}") + "\n" for i in range(1, 3001))
    h = text_logs.read_text_log("x.log", text=text)
    assert h.steps == list(range(1, 3001)) and h.norms[:2] == [1.01, 1.02]
    assert sum(read) == 2999  # every line but the first, from which the template was made


@pytest.mark.parametrize("extra", ["\u2502 \u2588\u258c", "\u00c9t\u00c9 \u2160", "\U0001f680 \u0391\u00df",
                                   "\u212a"])  # (the Kelvin sign: lowered to an ASCII k)
def test_the_compiled_template_reads_lines_of_characters_that_are_not_ascii(monkeypatch, extra):
    """A tqdm bar's blocks, accented capitals, Greek, an emoji: the compiled reader lowers them as
    str.lower() does (their simple mapping) and reads their lines; the history is the patterns'."""
    from gradtool.io import text_logs

    scan = text_logs._template_text()
    if scan is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    text = "".join(_RUN_ROW.format(i, 2.0 + i % 5, f"{1 + i / 100:.3f}") + f" {extra}\n"
                   for i in range(1, 3001))
    rows = []

    def counted(*a):
        got = scan(*a)
        rows.append(got[2])
        return got

    monkeypatch.setattr(text_logs, "_template_text", lambda: counted)
    h = text_logs.read_text_log("x.log", text=text)
    assert sum(rows) == 2999 and h.steps == list(range(1, 3001)) and h.norms[:2] == [1.01, 1.02]
    monkeypatch.setattr(text_logs._LineTemplate, "of", classmethod(lambda cls, line, match: None))
    slow = text_logs.read_text_log("x.log", text=text)
    assert (slow.steps, slow.norms, slow.loss, slow.notes) == (h.steps, h.norms, h.loss, h.notes)


def test_the_compiled_template_on_a_text_not_of_one_byte_characters_allocates_a_line_not_the_text():
    """template_text (gradtool/io/_logscan.c) on a str of two-byte characters (a log with a capital sigma
    in every line, which it leaves to Python) allocates about a line: its buffer was sized to the rest of
    the text at every call, a call a line (200,000 such Megatron lines: 3.1 s, 1.5 s without it)."""
    import tracemalloc

    from gradtool.io import text_logs

    scan = text_logs._template_text()
    if scan is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    row = _RUN_ROW + " \u03a3"
    template = _run_template(row)
    text = "\n".join(row.format(i, 2.0, "1.5") for i in range(1, 50_001)) + "\n"  # 3.6 MB of text
    tracemalloc.start()
    try:
        got = scan(template.ops, text, 0, template.out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == (0, 0, 0) and peak < 256 * 1024  # a line that is not ASCII: left to Python at once


def test_a_template_run_cut_short_reads_its_own_lines_not_a_window():
    """A run of lines ended by another kind of line (a log's timers every few steps) lowercases about its
    own lines, not a whole window of the text after them: reading a long log of such runs is linear (a
    4 MiB window each run made 100,000 lines of Megatron's with a timer line every five take 25 s)."""
    import tracemalloc

    template = _run_template()
    line = _RUN_ROW.format(7, 2.5, "1.250") + "\n"
    text = line * 3 + "saving checkpoint\n" + line * 50_000  # 4 MB after the run
    tracemalloc.start()
    try:
        got, pos = template.run(text, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) == 3 and pos == 3 * len(line)
    assert peak < 64 * 1024  # the first window: ~4 KiB of text lowercased, and three rows


_FIRST_LINE_CASES = [('[ \n {"step": 1, "grad_norm": 1.5}, {"step": 2, "grad_norm": 2.5}]', "json"),
                     ('{"step": 1, "grad_norm": 1.5}\n{"step": 2, "grad_norm": 2.5}\n', "jsonl"),
                     ("[rank0]: step 1 | grad_norm: 1.5\n[rank0]: step 2 | grad_norm: 2.5\n", "text"),
                     ("1795521146861 1.5 1\r\n1795521146862 2.5 2\r\n", "mlflow")]


@pytest.mark.parametrize("lead, body, kind", [("", "step,grad_norm\n1,1.5\n2,2.5\n", "csv")] + [
    (lead, body, kind) for lead in ("", "\n\n", " \t\r\n  ") for body, kind in _FIRST_LINE_CASES])
def test_a_log_is_told_by_its_first_line_after_blank_space(tmp_path, lead, body, kind):
    """The first character that is no space and the first line are found in place (not by copying the
    text stripped and split): blank lines and spaces before them change nothing."""
    p = tmp_path / ("grad_norm" if kind == "mlflow" else "log.txt")  # an MLflow metric file's name
    p.write_text(lead + body, encoding="utf-8")
    h = read_norm_log(str(p))
    assert h.kind == kind and h.norms == [1.5, 2.5] and h.steps == [1, 2]


def test_a_line_too_long_for_a_template_is_read_by_the_patterns(monkeypatch):
    """Lines longer than _TEMPLATE_LINE_MAX make no template (a hostile log of long lines, each different,
    would compile one per try): they are read line by line, to the same history."""
    from gradtool.io import text_logs

    pad = "x" * 5000
    text = "".join(f"step {s} | {pad} | grad norm: {1 + s / 4} |\n" for s in range(1, 40))
    made = []
    of = text_logs._LineTemplate.of.__func__
    monkeypatch.setattr(text_logs._LineTemplate, "of",
                        classmethod(lambda cls, line, m: made.append(of(cls, line, m)) or made[-1]))
    h = text_logs.read_text_log("x.log", text=text)
    assert h.steps == list(range(1, 40)) and h.norms == [1 + s / 4 for s in range(1, 40)]
    assert made and not any(made)


_MEGATRON_FIELDS = [("iteration", " ", "{}/ 1000"), ("consumed samples", ": ", "{}"),
                    ("learning rate", ": ", "{}"), ("lm loss", ": ", "{}"), ("loss scale", ": ", "{}"),
                    ("grad norm", ": ", "{}"), ("number of skipped iterations", ": ", "{}")]


_READABLE = st.one_of(st.integers(0, 10**7).map(str), st.floats(-1e9, 1e9).map(repr),
                      st.floats(0, 1e9).map(lambda v: f"{v:.3e}"),
                      st.floats(0, 1e9).map(lambda v: f"{v:.6E}"),
                      st.sampled_from(["nan", "inf", "infinity", "1.", "0012", "12e", "1e+5", "nax",
                                       "infinit"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_READABLE, _READABLE, _READABLE, _TEMPLATE_VALUES), min_size=7, max_size=7),
       st.lists(st.integers(0, 3), min_size=7, max_size=7),
       st.sampled_from(["", " |", "x", " | extra", "|"]), st.sampled_from([" | ", "  ", " |  "]),
       st.lists(st.integers(1, 10**6).map(str), min_size=3, max_size=3),
       st.sampled_from([None, None, None, "|", " |", "| "]), st.booleans())
@example(["1", "8", "1e-4", "2.5", "1.0", "infinity", "0"], [0] * 7, " |", " | ", ["1", "2", "3"], None, False)
@example(["1", "8", "1e-4", "nan", "-1.0", "inf", "0"], [1] * 7, " |", " | ", ["1", "2", "3"], None, False)
@example(["1", "8", "1e-4", "infinity", "1.0", "2.5", "0"], [0] * 7, " |", " | ", ["1", "2", "3"], None, False)
@example(["1", "8", "1e-4", "2.5", "1.0", "nax", "0"], [0] * 7, " |", " | ", ["1", "2", "3"], None, False)
@example(["1", "8", "1e-4", "2.5", "1.0", "1.5", "0"], [0] * 7, " |", " | ", ["1", "2", "3"], "| ", False)
@example(["1", "8", "1e-4", "nan", "1.0", "1.5", "0"], [0] * 7, " |", " | ", ["1", "2", "3"], None, True)
@example(["1", "8", "1e-4", "+2.5", "1.0", "1.5", "0"], [0] * 7, " |", " | ", ["1", "2", "3"], None, True)
@example(["1", "8", "1e-4", "2.5", "1.0", "1.5", "0"], [0] * 7, " |", " | ", ["1", "2", "3"], None, True)
@example(["1", "8", "1e-4", "12.5", "1.0", "1.5", "0"], [0] * 7, " |", " | ", ["1", "2", "3"], None, True)
@example(["1", "8", "1e-4", "-12.5", "1.0", "1.5", "0"], [0] * 7, " |", " | ", ["1", "2", "3"], None, True)
def test_the_compiled_template_reads_a_line_as_its_pattern(values, pads, tail, sep, base, line_sep,
                                                          signed_loss):
    """template_text (gradtool/io/_logscan.c) on a line of a Megatron template's (its loss signed or not):
    where it reads the line, the template's pattern matches it and its groups, by int() and float(), are
    the numbers read; an ASCII line the pattern matches with short numbers is read by it (not left to
    the pattern)."""
    from gradtool.io import text_logs

    scan = text_logs._template_text()
    if scan is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    first = sep.join(f"{n}{i}{f.format(v)}" for (n, i, f), v in
                     zip(_MEGATRON_FIELDS, [base[0], base[1], "1.000e-04", "-2.0" if signed_loss else "2.0",
                                            "1.0", base[2], "0"])) + " |"
    template = text_logs._LineTemplate.of(first, text_logs._text_norm(first))
    assert template is not None and template.ops is not None
    line = ((line_sep or sep).join(f"{n}{i}{' ' * p}{f.format(v)}" for (n, i, f), v, p
                                   in zip(_MEGATRON_FIELDS, values, pads)) + tail).lower()
    text = f"{line}\nno word here\n{line}"
    stop, resume, rows = scan(template.ops, text, 0, template.out)
    m = template.pattern.fullmatch(line)
    if rows:
        assert m is not None and (stop, resume, rows) == (len(text), len(text), 2)
        want = [int(g) if k == 0 else float(g) for k, g in enumerate(m.groups())]
        got = [np.frombuffer(col, kind).tolist() for col, kind in zip(template.out, template.kinds)]
        first, second = ([repr(c[k]) for c in got] for k in (0, 1))
        assert [repr(v) for v in want] == first == second or "nan" in line
    else:
        assert (stop, resume) == (0, 0) and template.out == [bytearray()] * len(template.out)
        assert m is None or not line.isascii() or any(len(g) > 18 for g in m.groups())


_GROUPED = st.one_of(st.integers(-10**18, 10**18).map(lambda v: f"{v:,}"),
                     st.floats(-1e7, 1e7).map(lambda v: f"{v:,.2f}"),
                     st.sampled_from(["1,234", "1,23", "12,345,6", "1234,567", ",123", "1,234,", "1,234x",
                                      "+1,234", "-0,000", "999,999,999,999,999", "1,000,000,000,000,000"]))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_GROUPED, _READABLE, _TEMPLATE_VALUES), min_size=7, max_size=7),
       st.sampled_from(["", " |", "x", "\t|", "\x1f", ",5 |"]), st.booleans())
@example(["1", "1,234x", "1e-4", "2.5", "1,234", "1.5", "0"], " |", False)
@example(["1", "1,234", "1e-4", "-1,234", "1,234", "-0,000", "0"], " |", True)
@example(["1", "1,234,567,890,123,456", "1e-4", "2.5", "1,234", "1.5", "0"], " |", False)
def test_the_compiled_template_reads_thousands_commas_as_its_pattern(values, tail, signed):
    """template_text on lines of a template made from a line with a number in thousands commas (Megatron's
    consumed samples as "1,234", the loss and norm signed or not): where it reads a line, the pattern
    matches it and its groups, by int() and float() with the commas dropped, are the numbers read."""
    from gradtool.io import text_logs

    scan = text_logs._template_text()
    if scan is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    base = ["1", "1,234", "1.000e-04", "-2.0" if signed else "2.0", "1.0", "-1.5" if signed else "1.5", "0"]
    first = " | ".join(f"{n}{i}{f.format(v)}" for (n, i, f), v in zip(_MEGATRON_FIELDS, base)) + " |"
    template = text_logs._LineTemplate.of(first, text_logs._text_norm(first))
    assert template is not None and template.commas and template.ops is not None
    line = (" | ".join(f"{n}{i}{f.format(v)}" for (n, i, f), v in zip(_MEGATRON_FIELDS, values)) + tail).lower()
    text = f"{line}\n{line}"
    stop, resume, rows = scan(template.ops, text, 0, template.out)
    m = template.pattern.fullmatch(line)
    if rows:
        assert m is not None and rows == 2
        want = [int(g) if k == 0 else float(g.replace(",", "")) for k, g in enumerate(m.groups())]
        got = [np.frombuffer(col, kind).tolist() for col, kind in zip(template.out, template.kinds)]
        assert [repr(v) for v in want] == [repr(c[0]) for c in got] == [repr(c[1]) for c in got] or "nan" in line
    else:  # left to the pattern: a line that is not ASCII, a value of more than 15 digits, a long step
        assert (m is None or not line.isascii() or any(len(g.replace(",", "")) > 15 for g in m.groups()[1:])
                or len(m.group(1)) > 18)


_BACKTRACKING_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?=\s|$)|\d+\.?\d*(?:[eE][-+]?\d+)?)"  # before it was possessive


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["1", "12", "123", "1234", "0", ",", ",123", ",456", ",12", ",1234", ".", ".5",
                                  " ", "\n", "\t", "e-", "e+7", "x"]), max_size=14).map("".join), st.sampled_from([
    "({})", "({})(,\\d+)?x", "a?({}),", "({})\\s*(\\d*),?(\\d+)", "(?:{}|,)+$", "({})(?=,\\d)", "({}).*?(\\d+)$"]))
@example("1,234,5678 x", "({})(,\\d+)?x")
@example("12,345,678\n", "({})(,\\d+)?x")
def test_thousands_commas_matched_possessively_match_as_before(text, shape):
    """The number pattern's first form (1,234 before a space or the end) matched possessively finds, in
    any pattern around it and from every place, the matches it found backtracking: it has only one way to
    match where it does."""
    from hypothesis import assume

    from gradtool.io.text_logs import _UNSIGNED

    # (a number's digits repeated by "+" split every way before "$" fails: exponential in both patterns,
    # 20 digits ~20 s a search; the readers' patterns never repeat a number so, their slots are atomic)
    assume(not shape.endswith("+$") or sum(map(str.isdigit, text)) <= 10)
    now, before = (re.compile(shape.format(u)) for u in (_UNSIGNED, _BACKTRACKING_UNSIGNED))
    assert [m.groups() for m in now.finditer(text)] == [m.groups() for m in before.finditer(text)]
    for at in range(len(text) + 1):
        a, b = now.match(text, at), before.match(text, at)
        assert (a and (a.span(), a.groups())) == (b and (b.span(), b.groups()))


@pytest.mark.parametrize("first, line", [
    ("step 1 loss 2.0x grad norm: 1.5 tps: 1,234", "step 2 loss 1,234x grad norm: 1.5 tps: 1,234"),  # no
    ("step 1 loss 2.0 grad norm: -1.5 tps: 1,234", "step 2 loss 2.0 grad norm: -1,234 tps: 1,234"),  # space
    ("step 1 loss 2.0 grad norm: -1.5 tps: 1,234", "step 2 loss 2.0 grad norm: +1,234 tps: 9"),  # after it
    ("step 1 loss 2.0 grad norm: 1.5 tps: 1,234", "step 2 loss 2.0 grad norm: 1234,567 tps: 1,234"),
    ("step 1 loss 2.0 grad norm: 1.5 tps: 1,234", "step 2 loss 2.0 grad norm: 1,234,567,890,123,456 tps: 1"),
    ("step 1 loss 2.0 grad norm: 1.5 tps: 1,234", "step 2 loss 2.0 grad norm: 1,234,567,890,123,456,789 tps: 1"),
    ("step 1 loss 2.0 grad norm: 1.5 tps: 1,234", "step 2 loss 2.0 grad norm: 1,234,567,890,123 tps: 1"),
    ("step 1 loss 2.0 grad norm: 1.5 tps: 7", "step 2 loss 2.0 grad norm: 1,234 tps: 7"),  # no commas
    ("step 1 loss 2.0 grad norm: 1.5 | 1,234", "step 2 loss 2.0 grad norm: 1,234\t| 1,234"),
])
def test_the_compiled_template_reads_a_number_in_thousands_commas_as_the_pattern_does(first, line):
    from gradtool.io import text_logs

    scan = text_logs._template_text()
    if scan is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    template = text_logs._LineTemplate.of(first, text_logs._text_norm(first))
    _, _, rows = scan(template.ops, line, 0, template.out)
    m = template.pattern.fullmatch(line)
    if rows:
        want = [int(g) if k == 0 else float(g.replace(",", "")) for k, g in enumerate(m.groups())]
        assert [repr(v) for v in want] == [repr(np.frombuffer(c, kind)[0].item())
                                           for c, kind in zip(template.out, template.kinds)]
    else:  # left to the pattern: a value of more than 15 digits
        assert m is None or any(len(g.replace(",", "")) > 15 for g in m.groups())


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aB \tnorm1.:|") + ["\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d",
                                                                 "\x1e", "\x1f", "\x85", "\u2028", "\u2029",
                                                                 "\u0130", "\u212a", "\u03a3"])))
@example("a\r\nb\n\rc\r")
@example("\u03a3\n\u03a3a\u03a3\nK\u212a")
def test_a_text_log_is_read_line_by_line_as_splitlines_splits_it(text):
    """The text reader takes a log's lines one at a time (_line_at, after _newline_lines): from 0 on, the
    lines text.lower().splitlines() gives (every line break str.splitlines() knows, \\r\\n as one;
    lowercased line by line as the whole text is: a final sigma, the Kelvin sign, dotted capital I)."""
    from gradtool.io.text_logs import _line_at, _newline_lines

    lines, pos, newline = [], 0, _newline_lines(text)
    while pos < len(newline):
        line, pos = _line_at(newline, pos)
        lines.append(line)
    assert lines == text.lower().splitlines()


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["a", " ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1b", "\x1c", "\x1d",
                                 "\x1e", "\x1f", "\x85", "\u2028", "\u2029", "\u2588", "\u0120", "\u8005",
                                 "\U0001f680", "\xe9", "\x0a\x0d"]), max_size=60),
       st.integers(0, 40), st.sampled_from(["", "\xe9", "\u2588", "\U0001f680"]))
@example(["\r"] * 40, 0, "")
@example(["\r\n"] * 9, 17, "\u2588")
def test_the_compiled_newline_lines_gives_the_python_function_s_text(parts, pad, wide):
    """_logscan.newline_lines (two passes, SSE2 compares 16 bytes at a time) gives the text
    _newline_lines's Python gives, of the same kind of str (the same size), at any offset of a break in
    a block, in texts of one-, two- and four-byte characters; the text itself when it has no break but
    "\n"; None (left to the Python) when it holds U+0085, U+2028 or U+2029."""
    import os
    import sys

    from gradtool.io import compiled, text_logs

    readers = compiled.log_readers()
    if readers is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    text = "x" * pad + wide + "".join(parts)
    got = readers.newline_lines(text)
    os.environ["GRADTOOL_NO_KERNELS"] = "1"
    try:
        want = text_logs._newline_lines(text)
    finally:
        del os.environ["GRADTOOL_NO_KERNELS"]
    if any(c in text for c in "\x85\u2028\u2029"):
        assert got is None
        return
    assert got == want and sys.getsizeof(got) == sys.getsizeof(want)
    assert (got is text) == (want is text)


_SPLITLINES_BREAK = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def _lines_with_offsets(text):
    """(start, line, next) of each line of text as str.splitlines() splits it (a reference, by pattern)."""
    out, pos = [], 0
    while pos < len(text):
        m = _SPLITLINES_BREAK.search(text, pos)
        end, nxt = (len(text), len(text)) if m is None else (m.start(), m.end())
        out.append((pos, text[pos:end], nxt))
        pos = nxt
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["line"] * 3 + ["upper", "accent", "wide", "plain", "other"]),
                          st.lists(_READABLE, min_size=3, max_size=3)), min_size=1, max_size=8),
       st.lists(st.sampled_from(["\n", "\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85",
                                 "\u2028", "\n\r"]), min_size=8, max_size=8), st.booleans())
@example([("line", ["1", "2.5", "1.5"]), ("upper", ["2", "2.5", "1.5"]), ("plain", ["1"] * 3),
          ("line", ["3", "2.5", "1.5"])], ["\r\n"] * 8, True)
@example([("line", ["1", "2.5", "1.5"]), ("wide", ["2", "2.5", "1.5"])], ["\n"] * 8, False)
@example([("line", ["1", "2.5", "1.5"]), ("plain", ["1"] * 3), ("line", ["3", "2.5", "1.5"])],
         ["\n", "\x85", "\n"] + ["\n"] * 5, True)
def test_the_compiled_template_reads_a_text_as_its_lines(kinds, breaks, end_with_break):
    """template_text (gradtool/io/_logscan.c) on a text of lines (any line breaks, capitals, characters
    that are not ASCII, of one byte or more): the lines before `stop` holding "norm" are the template's
    (lowercased: its pattern matches them, giving the numbers read, in order), `resume` is where the line
    after the last one read starts, and the line at `stop` is one left to Python: not ASCII, or ended by
    a line break that is not, or holding "norm" and not matched (or a step too long)."""
    from gradtool.io import text_logs

    scan = text_logs._template_text()
    if scan is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    row = " iteration {}/ 1000 | lm loss: {} | grad norm: {} |"
    template = text_logs._LineTemplate.of(row.format(1, "2.0", "1.0"), text_logs._text_norm(
        row.format(1, "2.0", "1.0")))
    lines = []
    for kind, (step, loss, norm) in kinds:
        line = row.format(step, loss, norm)
        lines.append({"line": line, "upper": line.upper(), "accent": line + " \u00e9", "wide": "\u2588" + line,
                      "plain": "saving checkpoint", "other": f"grad norm: {norm}"}[kind])
    text = "".join(line + brk for line, brk in zip(lines, breaks))
    if not end_with_break:
        text = text.rstrip("".join(set(breaks)))
    stop, resume, rows = scan(template.ops, text, 0, template.out)
    want, last_next = [], 0
    for start, line, nxt in _lines_with_offsets(text):
        lowered = line.lower()
        if start >= stop:
            assert start == stop
            if (line + text[start + len(line):nxt]).isascii():  # a line and line break it reads
                m = template.pattern.fullmatch(lowered)
                assert "norm" in lowered and (m is None or len(m.group(1)) > 18)
            break
        if "norm" in lowered:
            m = template.pattern.fullmatch(lowered)
            assert m is not None and line.isascii()
            want.append([int(m.group(1))] + [float(g) for g in m.groups()[1:]])
            last_next = nxt
    else:
        assert stop == len(text)
    got = list(zip(*(np.frombuffer(col, kind).tolist() for col, kind in zip(template.out, template.kinds))))
    assert rows == len(want) == len(got) and resume == last_next
    assert [repr(v) for r in got for v in r] == [repr(v) for r in want for v in r]


def test_a_log_of_progress_bar_updates_is_not_split_into_csv_cells(tmp_path, monkeypatch):
    """A log of tqdm updates (each after a "\\r", one "\\n" at the end; a custom loop's
    ``set_postfix(grad_norm=...)``) was one line to the CSV-header check, which split the whole text into
    cells and looked at each (~35 us an update): its first line ends at the first "\\r", as the csv module
    ends a row."""
    from gradtool.io import logs

    n = 5000
    p = tmp_path / "train.log"
    p.write_text("".join(f"\rEpoch 0: {i // 50:3d}%|\u2588  | {i + 1}/{n} [00:01<00:30, 9.87it/s, "
                         f"loss=2.5, grad_norm={1 + i % 7 / 10:.3f}]" for i in range(n)) + "\n", encoding="utf-8")
    looked = []
    real = logs._looks_like_norm_key
    monkeypatch.setattr(logs, "_looks_like_norm_key", lambda k: looked.append(k) or real(k))
    h = read_norm_log(str(p))
    assert h.kind == "text" and h.norms == [1 + i % 7 / 10 for i in range(n)] and h.line_order
    assert len(looked) < 50
    assert logs._first_line("a,b\rc,d\ne", at_cr=True) == "a,b" and logs._first_line("x\r\ny", 0, True) == "x"
    assert logs._first_line("a,b\rc,d\ne") == "a,b\rc,d"  # a CSV's header: the csv module's to refuse
    assert logs._first_line("  a\n", 2) == "a" and logs._first_line("abc", at_cr=True) == "abc"


@pytest.mark.parametrize("row", [" step {:d}, loss {}, grad norm: {} | tps: 1,234 |",
                                 "[titan] 10:00:00,000 step: {:d} loss: {} grad_norm: {} tps: 12,345,678"])
def test_lines_of_thousands_commas_are_read_by_the_compiled_template(row):
    """Lines with numbers in thousands commas ("tps: 1,234", a time "10:00:00,000") make a template of
    such numbers, which the compiled reader reads (it left them to the pattern, ~4 us a line; a template
    that did not read even its own line, "00,000" one number, was made again every few lines, each
    time converting every record: 10^6 torchtitan lines did not finish in 12 minutes)."""
    from gradtool.io import text_logs

    scan = text_logs._template_text()
    if scan is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    text = "".join(row.format(i, 2.0 + i % 5, f"{1 + i / 100:.3f}") + "\n" for i in range(1, 3001))
    records, template = text_logs._text_records(text, False, False)
    assert template is not None and template.commas and template.ops is not None
    assert sum(r.stop - r.start for r in records if type(r) is text_logs._Run) == 2999
    h = text_logs.read_text_log("x.log", text=text)
    assert h.steps == list(range(1, 3001)) and h.norms == [float(f"{1 + i / 100:.3f}") for i in range(1, 3001)]


# Terminal control sequences: parts of _ANSI's pattern, near misses, and characters of each str width
_ANSI_PIECES = st.sampled_from(["\x1b", "[", "\x1b[", "0", "9", ";", "38;2;180;60;0", "m", "K", "H", "a", "z", "A", "Z",
                                "@", "`", "{", " ", "\n", "é", "€", "\U0001f600", "grad_norm: 1.5"])


@settings(max_examples=500, deadline=None)
@given(st.lists(_ANSI_PIECES, max_size=40).map("".join))
@example("\x1b[")
@example("a\x1b[31")
@example("\x1b[m\x1b[1;2H")
@example("x\x1b[2a\x1b[Z\x1b[;z\x1b[A\x1b[@\x1b[`\x1b[{")  # the letters that end one, and their neighbours
@example("\x1b\x1b[0mx")
@example("é\x1b[0m€\x1b[1m\U0001f600\x1b[2m")
def test_terminal_codes_are_removed_as_the_pattern_removes_them(text):
    """The compiled ``without_ansi`` (gradtool/io/_logscan.c) removes what ``re.sub`` of text_logs' ``_ANSI``
    removes, and nothing else, in a str of each width (1, 2 and 4 bytes a character); a text without a
    sequence comes back as itself."""
    from gradtool.io import text_logs
    from gradtool.io.compiled import log_readers

    want = text_logs._ANSI.sub("", text)
    assert text_logs.without_terminal_codes(text) == want
    readers = log_readers()
    if readers is None:
        return
    got = readers.without_ansi(text)
    assert got == want and type(got) is str
    assert max(map(ord, got), default=0) == max(map(ord, want), default=0)  # (the width of a canonical str)
    if want == text:
        assert got is text


def test_terminal_codes_take_one_copy_of_the_text(monkeypatch):
    """torchtitan's coloured lines: the compiled reader removes their six sequences a line in one copy
    (``re.sub``'s list of pieces and their join held twice the text: 10^6 lines, 1 GB -> 480 MB peak; the
    copy is made at the text's length and then cut), and the history read with it is the history read
    without it."""
    import tracemalloc

    from gradtool.io import text_logs
    from gradtool.io.compiled import log_readers

    readers = log_readers()
    if readers is None:
        pytest.skip("gradtool.io._logscan not built, or GRADTOOL_NO_KERNELS set")
    line = ("[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - \x1b[31mstep: {:2}  \x1b[32mloss:  8.1  "
            "\x1b[38;2;180;60;0mgrad_norm: {}  \x1b[34mtps: 1,234  \x1b[35mmfu: 23.4%\x1b[39m\n")
    text = "".join(line.format(s, 1 + s % 7 / 10) for s in range(1, 20_001))
    tracemalloc.start()
    try:
        stripped = readers.without_ansi(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stripped == text_logs._ANSI.sub("", text) and peak < len(text) + 64 * 1024
    with_it = text_logs.read_text_log("train.log", text=text)
    monkeypatch.setenv("GRADTOOL_NO_KERNELS", "1")
    without = text_logs.read_text_log("train.log", text=text)
    assert (with_it.steps, with_it.norms, with_it.loss) == (without.steps, without.norms, without.loss)
    assert with_it.steps == list(range(1, 20_001)) and with_it.norms[:3] == [1.1, 1.2, 1.3]


@pytest.mark.parametrize("kernels", ["", "1"])
def test_a_templates_numbers_with_thousands_commas_anywhere_in_a_run(monkeypatch, kernels):
    """A template of thousands commas ("tps: 1,234") converts its captured columns without replacing commas
    when none holds one; a norm of "1,234" after a thousand lines without one is still 1234."""
    from gradtool.io import text_logs

    monkeypatch.setenv("GRADTOOL_NO_KERNELS", kernels)
    norms = ["0.5"] * 3000
    norms[2500] = norms[2999] = "1,234"
    text = "".join(f"step: {s}  loss: 2.5  grad_norm: {g}  tps: 1,234\n" for s, g in enumerate(norms, 1))
    h = text_logs.read_text_log("train.log", text=text)
    assert h.steps == list(range(1, 3001))
    assert h.norms == [1234.0 if g == "1,234" else 0.5 for g in norms]


_LOG_BYTES = {
    "utf-8": "step,grad_norm\n1,1.5\n2,\u00e92.5 \U0001f680\n".encode(),
    "utf-8 with its mark": b"\xef\xbb\xbfstep,grad_norm\n1,1.5\n",
    "utf-16-le with its mark": "\ufeffstep,grad_norm\n1,1.5\n".encode("utf-16-le"),
    "utf-16-be with its mark": "\ufeffstep,grad_norm\n1,1.5\n".encode("utf-16-be"),
    "invalid utf-8": b"step,grad_norm\n1,\xff1.5\xc3\n",
    "empty": b"",
    "only the mark": b"\xef\xbb\xbf",
    "a pickle": b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94.",
    "nul bytes": b"step,grad_norm\n1,1.5\n\0\0\0",
    "nul after the mark": b"\xef\xbb\xbf\0abc",
    "a pickle after the mark": b"\xef\xbb\xbf\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94.",
}
_LOG_TEXTS = {  # what each is read as: its text, or the error's words
    "utf-8": "step,grad_norm\n1,1.5\n2,\u00e92.5 \U0001f680\n",
    "utf-8 with its mark": "step,grad_norm\n1,1.5\n",
    "utf-16-le with its mark": "step,grad_norm\n1,1.5\n",
    "utf-16-be with its mark": "step,grad_norm\n1,1.5\n",
    "invalid utf-8": "step,grad_norm\n1,\ufffd1.5\ufffd\n",
    "empty": "",
    "only the mark": "",
    "a pickle": "is a Python pickle",
    "nul bytes": "binary file",
    "nul after the mark": "binary file",
    "a pickle after the mark": "is a Python pickle",
}


@pytest.mark.parametrize("name", sorted(_LOG_BYTES))
def test_a_mapped_log_reads_as_a_log_read_into_memory(tmp_path, monkeypatch, name):
    """Large logs are decoded from a memory map of the file (``_mapped_text``), small ones read: both give
    the same text, or the same error (naming the file), whatever the bytes; the map is closed after either
    (a view of it left alive would make closing it fail)."""
    import mmap

    from gradtool.io import logs

    p = tmp_path / "train.log"
    p.write_bytes(_LOG_BYTES[name])
    outcomes = []
    maps: list = []
    real_mmap = mmap.mmap

    def tracked(*args, **kwargs):
        maps.append(real_mmap(*args, **kwargs))
        return maps[-1]

    monkeypatch.setattr(mmap, "mmap", tracked)
    for threshold in (1 << 60, 0):
        monkeypatch.setattr(logs, "_MAP_LOG_BYTES", threshold)
        try:
            outcomes.append(("text", logs._read_text(str(p))))
        except InputError as exc:
            outcomes.append(("error", str(exc)))
    assert outcomes[0] == outcomes[1]
    kind, got = outcomes[0]
    assert got == _LOG_TEXTS[name] if kind == "text" else (str(p) in got and _LOG_TEXTS[name] in got)
    assert len(maps) == (0 if name == "empty" else 1) and all(m.closed for m in maps)  # (an empty file: read)
    assert p.read_bytes() == _LOG_BYTES[name]


def test_a_key_a_text_log_cannot_read_is_a_usage_error(tmp_path, run):
    """--key on a text log names its gradient norm (by any of the names the text reader reads it by); a
    key it cannot read (a loss, a typo) was ignored and the norm read without a word: now exit 2, one
    line. A console of dict lines reads any of its keys, and the others are the same error."""
    meg = tmp_path / "train.log"
    meg.write_text("".join(f" iteration {i:6d}/ 100 | lm loss: 2.0 | grad norm: {1 + i / 100:.3f} |\n"
                           for i in range(1, 40)))
    for key in ("grad_norm", "grad norm", "gnorm", "norm", None):
        assert read_norm_log(str(meg), key=key).norms[:2] == [1.01, 1.02]
    for key in ("lm loss", "grad_nrom"):
        with pytest.raises(UsageError, match=f"no metric {key!r}: a text log's gradient norm is read by"):
            read_norm_log(str(meg), key=key)
    r = run("suggest-threshold", str(meg), "--key", "loss")
    assert r.exit_code == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    con = tmp_path / "console.log"
    con.write_text("***** Running training *****\n" + "".join(
        f"{{'loss': {3 - i / 100}, 'grad_norm': {1 + i / 100}, 'epoch': {i / 100}}}\n" for i in range(40)))
    assert read_norm_log(str(con), key="loss").norms[:2] == [3.0, 2.99]
    with pytest.raises(UsageError, match="no metric 'nope'"):
        read_norm_log(str(con), key="nope")


@pytest.mark.parametrize("opening", ["", "  5%|▌         | 1/40 [00:00<00:01, 30.0it/s]\n"])
@pytest.mark.parametrize("mapped", [False, True])
def test_a_console_of_dict_lines_without_the_norm_says_what_its_dict_lines_hold(tmp_path, run, monkeypatch,
                                                                               opening, mapped):
    """A console whose dict lines lack the metric --key names, or (without --key) any gradient norm, says
    so and lists their keys, as a JSON Lines log does: the readers tried after the dict lines answered
    instead, "no JSON objects found" (exit 1, for a --key: a usage error) when the first line is a dict,
    else the text reader's "no 'grad norm: X' values". Whether the log opens with a dict or a progress
    bar, decoded or read from its memory map."""
    from gradtool.io import logs

    monkeypatch.setattr(logs, "_MAP_LOG_BYTES", 0 if mapped else 1 << 60)
    con = tmp_path / "console.log"
    lines = [f"{{'loss': {3 - i / 100}, 'grad_norm': {1 + i / 100}, 'learning_rate': 1e-05, "
             f"'epoch': {i / 100}}}\n" for i in range(40)]
    con.write_text(opening + "".join(lines))
    r = run("suggest-threshold", str(con), "--key", "nope")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == (f"gradtool: error: {con}: its dict lines have no metric 'nope' "
                                "(metrics: epoch, grad_norm, learning_rate, loss)")
    assert read_norm_log(str(con), key="learning_rate").norms[:2] == [1e-05, 1e-05]  # (any of its keys)
    bare = tmp_path / "no_norm.log"
    bare.write_text(opening + "".join(line.replace("grad_norm", "tokens") for line in lines))
    r = run("suggest-threshold", str(bare))
    assert r.exit_code == 1 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith(f"gradtool: error: {bare}: its dict lines have no gradient-norm metric "
                               "(metrics: epoch, learning_rate, loss, tokens); name it with --key; "
                               "the Hugging Face Trainer")
    assert read_norm_log(str(bare), key="tokens").norms[:2] == [1.0, 1.01]  # (and --key names one)


@pytest.mark.parametrize("mapped", [False, True])
def test_a_text_log_after_a_config_printed_as_a_dict(tmp_path, run, monkeypatch, mapped):
    """A log that opens with a config printed as a dict (``print(vars(args))``) and goes on in text lines
    (or nested JSON Lines) is read by them: it ended in "no JSON objects found" (exit 1), the first
    line's "{" having sent it to the JSON Lines reader once its dict lines held no norm."""
    from gradtool.io import logs

    monkeypatch.setattr(logs, "_MAP_LOG_BYTES", 0 if mapped else 1 << 60)
    meg = tmp_path / "train.log"
    meg.write_text("{'seed': 1, 'lr': 0.1}\n" + "".join(
        f" iteration {i:6d}/ 100 | lm loss: 2.0 | grad norm: {1 + i / 100:.3f} |\n" for i in range(1, 40)))
    hist = read_norm_log(str(meg))
    assert hist.norms[:2] == [1.01, 1.02] and hist.steps[:2] == [1, 2]
    r = run("suggest-threshold", str(meg), "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["history"]["n"] == 39
    nested = tmp_path / "nested.log"
    nested.write_text("{'seed': 1}\n" + "".join(
        json.dumps({"step": i, "train": {"grad_norm": 1 + i / 100}}) + "\n" for i in range(1, 40)))
    hist = read_norm_log(str(nested))
    assert hist.norms[:2] == [1.01, 1.02] and hist.steps[:2] == [1, 2]


def test_a_text_log_with_a_dict_line_keeps_its_own_errors(tmp_path):
    """A text log without norm lines whose dict lines hold a norm whose values are no numbers keeps the
    text reader's error; a text log without dict lines keeps it too."""
    odd = tmp_path / "odd.log"
    odd.write_text("step 1 loss 2\n{'grad_norm': 'n/a'}\n")
    with pytest.raises(InputError, match="no 'grad norm: X' values found"):
        read_norm_log(str(odd))
    plain = tmp_path / "plain.log"
    plain.write_text("step 1 loss 2\nstep 2 loss 1\n")
    with pytest.raises(InputError, match="no 'grad norm: X' values found"):
        read_norm_log(str(plain))


def test_a_template_compiles_one_pattern_for_its_line_and_its_runs(monkeypatch):
    """A custom loop's tqdm log: a template compiles one pattern, which reads its own line (fullmatch) and
    runs of lines (match to a line's end); each compiled two, ~11 ms apiece for a tqdm line. And the bar's
    cells are free in it: one template reads every state of the bar (two here: the first line's bar is
    all spaces, no bar to it), where each state made one (~80 in a 10^6-line log)."""
    from gradtool.io import text_logs

    made, compiled = [], []
    of, compile_ = text_logs._LineTemplate.of.__func__, re.compile

    def counted_of(cls, line, m):
        template = of(cls, line, m)
        made.append(template is not None)
        return template

    def counted_compile(pattern, flags=0):
        compiled.append(pattern)
        return compile_(pattern, flags)

    monkeypatch.setattr(text_logs._LineTemplate, "of", classmethod(counted_of))
    monkeypatch.setattr(text_logs.re, "compile", counted_compile)
    full, blocks = "\u2588", " \u258f\u258e\u258d\u258c\u258b\u258a\u2589"
    n = 4000

    def update(i):  # tqdm's line: a bar of ten cells, whole blocks then an eighth of one
        bar = (full * (i * 10 // n) + blocks[i * 80 // n % 8]).ljust(10)[:10]
        return (f"\rEpoch 0: {i * 100 // n:3d}%|{bar}| {i}/{n} [00:0{i % 10}<12:34,  9.87it/s, loss=2.500, "
                f"grad_norm={1 + i / 1000:.3f}]")

    text = "".join(update(i) for i in range(1, n + 1))
    h = text_logs.read_text_log("tqdm.log", text=text + "\n")
    assert h.norms[:3] == [1.001, 1.002, 1.003] and len(h.norms) == n
    assert sum(made) == 2  # the first line's, then one for every state of the bar
    assert len(compiled) == sum(made)  # one pattern each


_BAR_CELL = st.sampled_from([" ", "#", "1", "5", "9", "\u2588", "\u258c", "\u258f", "\u2580", "\u259f"])
_NOT_A_CELL = st.sampled_from(["0", ".", "a", "\u257f", "\u25a0", "|", "\u2502", "-"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_BAR_CELL, _BAR_CELL, _BAR_CELL, _NOT_A_CELL), max_size=14),
       st.sampled_from(["\u2588\u258c   ", "###5  ", "#"]), st.sampled_from(["Epoch", "epoch", "EPOCH"]),
       st.sampled_from(["2.5", "2.345678", "12.25"]))
@example([], "#", "epoch", "2.5")
@example(list("\u2588" * 10), "\u2588\u258c   ", "Epoch", "2.5")
@example(["\u257f"], "#", "epoch", "2.5")
def test_a_bar_s_cells_are_read_alike_by_the_pattern_and_the_compiled_template(cells, origin, word, loss):
    """A tqdm line's template leaves its bar's cells free (_BAR_CELLS, op (4,)): any run of " #1-9" and
    the block elements U+2580-U+259F between the bar's "|"s, none of anything else (a "0", a dot, a letter,
    a box-drawing line); the compiled reader (template_text), where built, reads a line exactly where the
    pattern matches it lowercased, the same numbers (capitals before and after the bar, at any offset of
    the eight characters it lowers at once)."""
    from gradtool.io import text_logs

    def update(bar, loss, norm, word="epoch"):
        return f"{word} 0:  45%|{bar}| 450/1000 [00:10<12:34,  9.87it/s, Loss={loss}, grad_norm={norm}]"

    first = update(origin, "2.345", "1.234").lower()
    template = text_logs._LineTemplate.of(first, text_logs._text_norm(first))
    assert template is not None and (4,) in template.ops and [k for k, _ in template.order] == ["grad_norm", "loss"]
    line = update("".join(cells), loss, "0.75", word)
    m = template.pattern.fullmatch(line.lower())
    assert (m is not None) == all(c in " #123456789" or "\u2580" <= c <= "\u259f" for c in cells)
    if m is not None:
        assert m.groups() == (loss, "0.75")
    scan = text_logs._template_text()
    if scan is None:  # (not built, or GRADTOOL_NO_KERNELS set)
        return
    text = f"{line}\n{line}"
    stop, resume, rows = scan(template.ops, text, 0, template.out, True)
    if m is None:
        assert rows == 0 and (stop, resume) == (0, 0)
    else:
        assert rows == 2 and (stop, resume) == (len(text), len(text))
        assert [np.frombuffer(col, "<f8").tolist() for col in template.out] == [[float(loss)] * 2, [0.75] * 2]


@pytest.mark.parametrize("bar", ["\u2588", "#"])
def test_a_bar_holds_no_value_the_reader_reads(bar):
    """A line whose "bar" between two "|"s holds a value the patterns read, or holds no "#" nor block
    (a table's cells of digits), keeps that text fixed in its template: no bar there."""
    from gradtool.io import text_logs

    for line, bars in [(f"epoch 0:  45%|{bar * 3}   | loss=2.5, grad_norm=1.0]", 1),
                       ("| 12 | 34 | loss=2.5, grad_norm=1.0 |", 0),
                       ("|    | loss=2.5, grad_norm=1.0 |", 0)]:
        template = text_logs._LineTemplate.of(line, text_logs._text_norm(line))
        assert template is not None and template.ops.count((4,)) == bars, line
        assert template.pattern.fullmatch(line).groups() == ("2.5", "1.0")
