"""A history of dumps keeps only each dump's series (``StepSeries``), not every statistic of every tensor,
and reads each dump once: ``suggest-threshold`` on 32 dumps of 20,000 tensors held 0.5 GB of per-tensor
statistics and opened every dump twice (once for its metadata step)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool import save_dump
from gradtool.core.stats import TensorStats
from gradtool.io.base import LOSS_KEYS, LR_KEYS
from gradtool.summarize import DumpSummary, StepSeries, history_of, metadata_number


def _reference(rows: list[DumpSummary]):
    """The series as dump_history built them from whole summaries (before StepSeries): lists, NaN where a
    step's dump lacks the tensor, max |g| 0 where a tensor has none."""
    rows = sorted(rows, key=lambda s: s.step if s.step is not None else 0)
    last = {s.step: i for i, s in enumerate(rows) if s.step is not None}
    repeated = sorted({s.step for i, s in enumerate(rows) if s.step is not None and last[s.step] != i})
    rows = [s for i, s in enumerate(rows) if s.step is None or last[s.step] == i]
    names: dict[str, int] = {}
    for s in rows:
        for n, t in s.tensors:
            if t.is_float:
                names.setdefault(n, t.size)
    norms = {n: [] for n in names}
    maxabs = {n: [] for n in names}
    for s in rows:
        by = {n: t for n, t in s.tensors}
        for n in names:
            t = by.get(n)
            norms[n].append(t.l2_norm if t else float("nan"))
            maxabs[n].append((t.max_abs if t.max_abs is not None else 0.0) if t else float("nan"))
    return ([s.step if s.step is not None else i for i, s in enumerate(rows)], [s.global_norm for s in rows],
            [metadata_number(s.metadata, LOSS_KEYS) for s in rows], [metadata_number(s.metadata, LR_KEYS) for s in rows],
            norms, maxabs, names, repeated)


def _stats(size: int, norm: float, max_abs: float | None, is_float: bool) -> TensorStats:
    return TensorStats(shape=(size,), dtype="float32" if is_float else "int32", size=size, is_float=is_float,
                       norm_type=2.0, norm=norm, l2_norm=norm, avg_norm=norm / max(size, 1), max_abs=max_abs,
                       min=None, max=None, mean=0.0, std=0.0, nan_count=0, inf_count=0, zero_count=0)


_summary = st.builds(
    lambda step, tensors, meta: (step, tensors, meta),
    st.one_of(st.none(), st.integers(0, 6)),
    st.dictionaries(st.sampled_from(["a", "b", "c.w", "d"]),
                    st.tuples(st.integers(0, 9), st.floats(0, 1e3) | st.just(math.nan),
                              st.none() | st.floats(0, 10), st.booleans()), max_size=4),
    st.dictionaries(st.sampled_from(["loss", "lr", "step_time"]), st.floats(0, 5), max_size=2))


@settings(max_examples=200, deadline=None)
@given(st.lists(_summary, max_size=8))
def test_a_history_of_step_series_is_the_history_of_the_whole_summaries(drawn):
    rows = []
    for step, tensors, meta in drawn:
        s = DumpSummary("x.npz", "npz", None, step, 2.0, meta)
        s.tensors = [(n, _stats(*t)) for n, t in tensors.items()]
        rows.append(s)
    names: dict[str, str] = {}
    h = history_of([StepSeries.of(s, names) for s in rows])
    steps, global_norms, loss, lr, norms, maxabs, sizes, repeated = _reference(rows)
    assert (h.steps, repr(h.global_norms), h.loss, h.lr, h.tensor_sizes, h.repeated_steps) == (
        steps, repr(global_norms), loss, lr, sizes, repeated)
    assert list(h.tensor_norms) == list(norms) and list(h.tensor_max_abs) == list(maxabs)
    for got, want in ((h.tensor_norms, norms), (h.tensor_max_abs, maxabs)):
        for n in want:
            assert got[n].dtype == np.float64 and got[n].flags.c_contiguous
            assert repr(got[n].tolist()) == repr([float(v) for v in want[n]]), n


def test_step_series_share_their_names_and_keep_no_tensor_statistics():
    rows = []
    for step in range(3):
        s = DumpSummary("x.npz", "npz", None, step, 2.0, {})
        s.tensors = [("".join(["w", str(k)]), _stats(4, 1.0 + k, 0.5, True)) for k in range(3)]  # new strings
        rows.append(s)
    names: dict[str, str] = {}
    series = [StepSeries.of(s, names) for s in rows]
    assert all(a is b for a, b in zip(series[0].names, series[2].names))  # one string per name
    assert not any(isinstance(v, (TensorStats, DumpSummary)) for s in series for v in vars(s).values())


@pytest.fixture
def history_dir(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    rng = np.random.default_rng(0)
    for s in range(20):
        save_dump(str(d / f"step_{s:03d}.safetensors"),
                  {f"l{k}.w": rng.standard_normal(50).astype(np.float32) * (k + 1) for k in range(5)},
                  metadata={"step": 100 + s} if s != 3 else None)  # step 3: none in its metadata
    return d


def test_suggest_threshold_opens_each_dump_once(run, history_dir, monkeypatch):
    """Steps come from the metadata as each dump is read, not from an extra open of every dump."""
    from gradtool.io import history

    opened = []
    real = history.open_dump

    def counting(path, **kw):
        opened.append(path)
        return real(path, **kw)

    monkeypatch.setattr(history, "open_dump", counting)
    r = run("suggest-threshold", str(history_dir), "--mode", "global-norm", "--burn-in", "0", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert sorted(opened) == sorted(str(p) for p in history_dir.iterdir())  # once each
    doc = json.loads(r.stdout)
    # the metadata's steps, and for the dump without one its file name's (3)
    assert doc["history"]["first_step"] == 3 and doc["history"]["last_step"] == 119


def test_each_summary_holds_one_dump_at_a_time(history_dir):
    from gradtool.engine import each_summary
    from gradtool.io import history

    refs = history.expand_inputs([str(history_dir)], resolve_steps=False)
    done = []
    it = each_summary(refs, on_dump=done.append)
    i, first = next(it)
    assert i == 0 and first.step == 100 and done == []  # the second dump not read yet
    assert [i for i, _ in it] == list(range(1, 20)) and len(done) == 20


def test_suggest_threshold_on_only_unreadable_dumps_says_so(run, tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    for s in range(2):
        (d / f"step_{s}.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")  # cut short
    r = run("suggest-threshold", str(d), "--skip-unreadable")
    assert r.exit_code == 1 and "no readable dump (all 2 skipped)" in r.stderr
