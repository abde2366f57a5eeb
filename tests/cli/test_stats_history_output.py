"""``stats`` on a history makes each dump's output as the dump is read and keeps it as text, not every
tensor's statistics of every step (32 dumps of 20,000 tensors: 0.8 GB for a table, 1.75 GB for JSON);
the output is written in step order at the end, the same text as a document made whole."""

from __future__ import annotations

import gc
import json
import math
import weakref

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool import save_dump
from gradtool.cli import render

_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(),
                  st.text(max_size=8), st.just("\u2028 \"quoted\" \\ \n"))
_value = st.recursive(_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                      max_leaves=12)
_record = st.dictionaries(st.text(max_size=6), _value, max_size=5)


@settings(max_examples=300, deadline=None)
@given(st.lists(_record, min_size=1, max_size=4), st.lists(_record, max_size=2))
@example([{"tensors": [], "metadata": {}}], [])
@example([{"t": [{"x": 1.5}] * 6000}], [{"dump": "a", "error": "b"}])  # past the msgspec layout's size
def test_a_document_written_item_by_item_is_the_whole_documents_text(items, skipped):
    import io

    out = io.StringIO()
    render.json_document("dumps", (render.json_list_item(r) for r in items), {"skipped": skipped}, out)
    assert out.getvalue() == render.dumps_json({"dumps": items, "skipped": skipped}) + "\n"


@settings(max_examples=200, deadline=None)
@given(st.lists(_record, min_size=1, max_size=3), st.lists(_value, max_size=7), st.integers(1, 4),
       st.booleans())
def test_a_record_s_last_list_encoded_a_block_at_a_time_is_the_whole_documents_text(records, tail, block,
                                                                                     layout):
    """A record's last member (a dump's tensors) is encoded ITEMS_PER_BLOCK items at a time, never
    whole: the same text, whatever the blocks (and with msgspec's layout or Python's)."""
    import io
    from unittest import mock

    items = [{**r, "tensors": tail} for r in records]
    out = io.StringIO()
    with mock.patch.object(render, "ITEMS_PER_BLOCK", block), \
            mock.patch.object(render, "MSGSPEC_LAYOUT_BYTES", 0 if layout else 1 << 40):
        render.json_document("dumps", (render.json_list_item(r) for r in items), {"skipped": []}, out)
        assert out.getvalue() == render.dumps_json({"dumps": items, "skipped": []}) + "\n"


def test_stats_json_encodes_a_dump_s_tensors_a_block_at_a_time(run, tmp_path, monkeypatch):
    """No more than ITEMS_PER_BLOCK tensors' records are encoded (made) at once, and the document is the
    one encoded whole; JSON Lines and CSV rows are the same a block at a time."""
    path = str(tmp_path / "d.npz")
    save_dump(path, {f"t{i}": np.full(3, i - 4.5, np.float32) for i in range(10)} | {"nan": np.array([np.nan])})
    whole = run("stats", path, "--format", "json")
    assert whole.exit_code == 0, whole.stderr
    longest = []
    encode = render.dumps_json

    def spy(doc, **kw):
        longest.append(len(doc) if isinstance(doc, list) else 0)
        return encode(doc, **kw)

    rows = {fmt: run("stats", path, "--format", fmt).stdout for fmt in ("jsonl", "csv")}
    monkeypatch.setattr(render, "ITEMS_PER_BLOCK", 3)
    monkeypatch.setattr(render, "dumps_json", spy)
    blocks = run("stats", path, "--format", "json")
    assert blocks.stdout == whole.stdout and max(longest) == 3
    assert [t["name"] for t in json.loads(blocks.stdout)["dumps"][0]["tensors"]] == [f"t{i}" for i in range(10)] + ["nan"]
    for fmt, text in rows.items():  # rows are written a block at a time too
        assert run("stats", path, "--format", fmt).stdout == text and len(text.splitlines()) == 11 + (fmt == "csv")


@pytest.mark.parametrize("budget", [0, 7, 1 << 20])
@pytest.mark.parametrize("read_bytes", [1, 3, 1 << 20])
def test_ordered_chunks_give_back_each_text_in_any_order(budget, read_bytes, monkeypatch):
    """Texts given whole or in parts come back whole or in parts (read back from the temporary file a few
    bytes at a time: a character's bytes split between two reads)."""
    monkeypatch.setattr(render.OrderedChunks, "READ_BYTES", read_bytes)
    texts = ["", "a", "ä€😀\n", ["\udcff sur", "", "rogate"], "x" * 1000, ["ä", "€😀", "last"], [],
             ("y" * k for k in range(12))]
    whole = [t if isinstance(t, str) else "".join(t) for t in texts[:-1]]
    whole.append("".join("y" * k for k in range(12)))
    chunks = render.OrderedChunks(budget)
    for t in texts:
        chunks.add(t)
    assert len(chunks) == len(texts)
    for i in [5, 0, 3, 7, 3, 1, 4, 2, 6]:
        assert chunks[i] == whole[i] == "".join(chunks.parts(i))
    chunks.add("after")  # (reading moved no write position)
    assert chunks[8] == "after" and chunks[2] == whole[2] and "".join(chunks.parts(5)) == whole[5]
    chunks.close()


def test_ordered_chunks_spill_a_text_given_in_parts_as_it_comes():
    """A text given part by part (a generator: a dump's JSON a block of tensors at a time) goes to the
    temporary file once the budget is spent, before its last part is made: no more than the budget
    and one part are held (the 20,000-tensor dump's ~10 MB of JSON were held whole first)."""
    chunks = render.OrderedChunks(10)
    chunks.add("abc")
    seen = []

    def parts():
        for k in range(6):
            seen.append(chunks._file is not None)  # (in the file already, when this part is made?)
            yield str(k) * 5

    chunks.add(parts())
    assert seen == [False, False, True, True, True, True]  # (3 + 5 + 5 > 10: spilled after the second)
    assert chunks[0] == "abc" and chunks[1] == "".join(str(k) * 5 for k in range(6)) and len(chunks) == 2
    chunks.close()


@pytest.fixture
def shuffled_history(tmp_path):
    """Dumps whose metadata steps run against their files' order (the output's order is known only when
    every dump is read), one with NaN, tensors that come and go."""
    d = tmp_path / "h"
    d.mkdir()
    rng = np.random.default_rng(3)
    for k, step in enumerate([40, 10, 30, 20, 50]):
        tensors = {f"layer.{i}.w": rng.standard_normal(6).astype(np.float32) * (i + 1) for i in range(4 + k % 2)}
        if step == 30:
            tensors["layer.0.w"][2] = np.nan
        save_dump(str(d / f"dump_{chr(97 + k)}.npz"), tensors, metadata={"step": step, "loss": 1.0 / step})
    return d


@pytest.mark.parametrize("args", [["--format", "json"], ["--format", "jsonl"], ["--format", "csv"],
                                  ["--format", "tsv"], [], ["--per-tensor"], ["--sort", "norm", "--top", "2"],
                                  ["--format", "json", "--sort", "size", "--top", "1"]])
def test_a_history_is_written_in_step_order_whatever_the_reading_order(run, shuffled_history, monkeypatch, args):
    files = sorted(str(p) for p in shuffled_history.iterdir())
    in_files_order = run("stats", *files, *args)
    by_step = [files[i] for i in (1, 3, 2, 0, 4)]  # given in step order
    assert in_files_order.exit_code == 0, in_files_order.stderr
    assert run("stats", *by_step, *args).stdout == in_files_order.stdout
    # and the same when every dump's text is kept in the temporary file
    monkeypatch.setattr(render.OrderedChunks.__init__, "__defaults__", (0,))
    assert run("stats", *files, *args).stdout == in_files_order.stdout
    if args[:2] == ["--format", "json"]:
        doc = json.loads(in_files_order.stdout)
        assert [d["step"] for d in doc["dumps"]] == [10, 20, 30, 40, 50]
        assert math.isnan(float(doc["dumps"][2]["global_norm"])) and doc["skipped"] == []
    if args == ["--per-tensor"]:  # each dump's table, in step order, then the history's
        out = in_files_order.stdout
        at = [out.index(f"(step {s}, npz") for s in (10, 20, 30, 40, 50)]
        assert at == sorted(at) and out.index("5 steps") > at[-1]


def test_a_history_with_nan_fails_on_nonfinite_naming_the_step(run, shuffled_history):
    r = run("stats", str(shuffled_history), "--fail-on-nonfinite", "--format", "json")
    assert r.exit_code == 3 and "step 30 (" in r.stderr and "layer.0.w" in r.stderr
    assert [d["step"] for d in json.loads(r.stdout)["dumps"]] == [10, 20, 30, 40, 50]


def test_the_output_keeps_no_dumps_statistics(shuffled_history):
    from gradtool.cli.stats import dump_record, stats_output
    from gradtool.io.dump import open_dump
    from gradtool.summarize import summarize_dump

    for fmt, per_tensor in (("json", None), ("csv", None), ("table", True), ("table", None), ("table", False)):
        with stats_output(fmt, per_tensor) as output:
            alive = []
            for path in sorted(shuffled_history.iterdir()):
                with open_dump(str(path)) as reader:
                    summary = summarize_dump(reader)
                alive.append(weakref.ref(summary.tensors[0][1]))  # a TensorStats
                output.add(dump_record(summary, None, None))
                del summary
            gc.collect()
            assert not any(w() for w in alive), fmt  # none held (a lone table dump's record only)
            assert [r["step"] for r in output.in_order()] == [10, 20, 30, 40, 50]


@pytest.mark.parametrize("args", [["--format", "json"], ["--format", "csv"], ["--format", "jsonl"], [],
                                  ["--per-tensor"]])
def test_clip_reports_a_history_dump_by_dump_the_same(run, shuffled_history, monkeypatch, tmp_path, args):
    """clip's report is made as each dump is clipped (in the order clipped), kept as text: the same text
    whether it stays in memory or goes to the temporary file, and of each dump only its steps' row held."""
    from gradtool.cli import clip

    held = []
    real = clip.clip_output

    def spy(*a, **kw):
        held.append(real(*a, **kw))
        return held[-1]

    monkeypatch.setattr(clip, "clip_output", spy)
    common = [str(shuffled_history), "--mode", "global-norm", "--max", "1", "--nonfinite", "zero", "--dry-run",
              *args]
    in_memory = run("clip", *common)
    assert in_memory.exit_code == 0, in_memory.stderr
    assert all(set(r) == set(clip.STEP_FIELDS) for r in held[-1].records)  # no tensor's figures held
    monkeypatch.setattr(render.OrderedChunks.__init__, "__defaults__", (0,))
    assert run("clip", *common).stdout == in_memory.stdout
    if args == ["--format", "json"]:
        doc = json.loads(in_memory.stdout)
        assert [d["step"] for d in doc["dumps"]] == [40, 10, 30, 20, 50]  # (clipped in file order)
        assert all(len(d["tensors"]) >= 4 for d in doc["dumps"])
    if args == ["--per-tensor"]:
        assert in_memory.stdout.count("(dry run, nothing written)") == 5
    if not args:
        assert "steps clipped" in in_memory.stdout and "layer.0.w" not in in_memory.stdout


def test_commands_run_with_the_youngest_generation_collected_less_often(run, shuffled_history, monkeypatch):
    """main() collects the youngest generation every GC_FIRST_GENERATION allocations while a command
    runs (a many-tensor dump's ~10^5 acyclic objects were scanned over and over), and gives the caller's
    thresholds back."""
    import gc

    from gradtool import engine
    from gradtool.cli.main import GC_FIRST_GENERATION

    seen = []
    real = engine.summarize_dump

    def spy(*a, **kw):
        seen.append(gc.get_threshold())
        return real(*a, **kw)

    monkeypatch.setattr(engine, "summarize_dump", spy)
    before = gc.get_threshold()
    assert before[0] < GC_FIRST_GENERATION  # (the interpreter's default, 700)
    assert run("stats", str(shuffled_history), "--format", "json").exit_code == 0
    assert seen and all(t == (GC_FIRST_GENERATION, *before[1:]) for t in seen)
    assert gc.get_threshold() == before


def test_a_temporary_file_that_cannot_take_the_output_is_a_one_line_error(run, shuffled_history, monkeypatch):
    import errno
    import tempfile

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(render.OrderedChunks.__init__, "__defaults__", (0,))
    monkeypatch.setattr(tempfile, "TemporaryFile", full)
    r = run("stats", str(shuffled_history), "--format", "json")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "No space left on device" in r.stderr and "TMPDIR" in r.stderr

    class Fills:  # room for the first dump's text only
        def __init__(self):
            self.n = 0

        def tell(self):
            return self.n

        def write(self, data):
            if self.n:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.n += len(data)

        def close(self):
            pass

    monkeypatch.setattr(tempfile, "TemporaryFile", Fills)
    r = run("stats", str(shuffled_history), "--format", "csv")
    assert r.exit_code == 1 and r.stdout == "" and "No space left on device" in r.stderr


def test_a_history_table_makes_no_tensor_records_it_does_not_show(run, shuffled_history, monkeypatch):
    """The steps' table shows no tensor: no tensor record is made (the first dump's are made only if it
    stays the only one and is shown); --per-tensor and the machine formats make every dump's, once."""
    from gradtool.cli import stats

    made = []
    real = stats.tensor_record
    monkeypatch.setattr(stats, "tensor_record", lambda *a: made.append(a[0]) or real(*a))
    files = sorted(str(p) for p in shuffled_history.iterdir())
    assert run("stats", *files).exit_code == 0
    assert made == []
    for args in (["--per-tensor"], ["--format", "csv"]):
        made.clear()
        assert run("stats", *files, *args).exit_code == 0
        assert len(made) == 4 + 5 + 4 + 5 + 4, args
