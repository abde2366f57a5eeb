"""Per-parameter gradient norms in a training log (Lightning's ``self.log_dict(grad_norm(self, 2))``:
``grad_2.0_norm/<parameter>`` beside ``grad_2.0_norm_total``; ``grad_inf_norm/<parameter>`` with
norm_type="inf"; Composer's ``l2_norm/grad/<parameter>``): the per-tensor ``norm`` (and ``value``) modes
were refused with "a training log carries only the global norm". They are derived from those columns,
and give what gradient dumps with the same norms give."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from gradtool import save_dump
from gradtool.io.logs import read_norm_log

NAMES = ("layer.0.weight", "layer.0.bias", "head.weight")
SCALES = (1.0, 0.1, 3.0)


def _norms(steps: int = 120, seed: int = 0, spike: int | None = 90) -> list[list[float]]:
    """Per-parameter norms of each step: lognormal around each parameter's scale, one spike."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(steps):
        row = [float(np.exp(rng.normal(math.log(sc), 0.3))) for sc in SCALES]
        out.append([x * 40 for x in row] if s == spike else row)
    return out


def _total(row: list[float]) -> float:
    return math.sqrt(sum(x * x for x in row))


def _lightning_csv(path, norms, inf=False, val_every=25):
    """metrics.csv as Lightning's CSVLogger writes it: epoch, step, the logged metrics, and validation
    rows of their own (empty cells for the training metrics)."""
    cols = [f"grad_2.0_norm/{n}" for n in NAMES] + (["grad_inf_norm/" + n for n in NAMES] if inf else [])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "step", "train_loss", *cols, "grad_2.0_norm_total", "val_loss"])
        for s, row in enumerate(norms):
            w.writerow([0, s, 2.0 / (1 + s), *row, *(row if inf else []), _total(row), ""])
            if s % val_every == val_every - 1:
                w.writerow([0, s, *[""] * (len(cols) + 2), 1.5])


def _dumps_with_the_same_norms(directory, norms):
    """One dump per step whose tensors have exactly the logged norms: one element each, so its L2 norm
    and its max |g| are both the value (float64: the global norm is the log's total)."""
    directory.mkdir()
    for s, row in enumerate(norms):
        save_dump(str(directory / f"step_{s:05d}.npz"), {n: np.array([v]) for n, v in zip(NAMES, row)})


def _modes(doc):
    return {m["mode"]: m for m in doc["modes"]}


def test_a_lightning_csv_recommends_per_tensor_norms_as_dumps_with_those_norms_do(run, tmp_path):
    norms = _norms()
    _lightning_csv(tmp_path / "metrics.csv", norms)
    _dumps_with_the_same_norms(tmp_path / "dumps", norms)
    log = run("suggest-threshold", str(tmp_path / "metrics.csv"), "--format", "json")
    assert log.exit_code == 0, log.stderr
    dumps = run("suggest-threshold", str(tmp_path / "dumps"), "--mode", "global-norm", "--mode", "norm",
                "--format", "json")
    assert dumps.exit_code == 0, dumps.stderr
    got, want = _modes(log.json()), _modes(dumps.json())
    assert set(got) == {"global-norm", "norm"}
    for mode in ("global-norm", "norm"):
        assert got[mode]["threshold"] == pytest.approx(want[mode]["threshold"], rel=1e-9), mode
    assert got["norm"]["per_tensor"].keys() == set(NAMES)
    for name in NAMES:
        assert got["norm"]["per_tensor"][name] == pytest.approx(want["norm"]["per_tensor"][name], rel=1e-9)
    assert got["norm"]["largest_tensor"] == "head.weight"
    cannot = log.json()["cannot_derive"]
    assert set(cannot) == {"average-norm", "value"}
    assert "without the tensors' sizes" in cannot["average-norm"]
    assert "grad_norm(norm_type='inf')" in cannot["value"]
    table = run("suggest-threshold", str(tmp_path / "metrics.csv"))
    assert "norm: largest per-tensor threshold from head.weight" in table.stdout


def test_max_abs_columns_give_the_value_mode(run, tmp_path):
    norms = _norms(seed=1)
    _lightning_csv(tmp_path / "metrics.csv", norms, inf=True)
    _dumps_with_the_same_norms(tmp_path / "dumps", norms)
    log = _modes(run("suggest-threshold", str(tmp_path / "metrics.csv"), "--format", "json").json())
    dumps = _modes(run("suggest-threshold", str(tmp_path / "dumps"), "--format", "json").json())
    assert log["value"]["threshold"] == pytest.approx(dumps["value"]["threshold"], rel=1e-9)
    assert log["value"]["per_tensor"] == pytest.approx(dumps["value"]["per_tensor"], rel=1e-9)


def test_per_tensor_thresholds_from_a_log_are_written_for_clip(run, tmp_path):
    norms = _norms(seed=2)
    _lightning_csv(tmp_path / "metrics.csv", norms)
    out = tmp_path / "thresholds.json"
    r = run("suggest-threshold", str(tmp_path / "metrics.csv"), "--per-tensor", "-o", str(out),
            "--format", "json")
    assert r.exit_code == 0, r.stderr
    written = json.loads(out.read_text())["thresholds"]
    assert written == {"norm": _modes(r.json())["norm"]["per_tensor"]}
    step = tmp_path / "step.npz"  # a dump whose head.weight is far above its threshold
    save_dump(str(step), {n: np.full(4, 100.0, np.float32) for n in NAMES})
    c = run("clip", str(step), "-o", str(tmp_path / "clipped.npz"), "--mode", "norm", "--thresholds", str(out),
            "--format", "json")
    assert c.exit_code == 0, c.stderr
    after = {t["name"]: t["norm_after"] for t in c.json()["dumps"][0]["tensors"]}
    for name in NAMES:
        assert after[name] == pytest.approx(written["norm"][name], rel=1e-6)


def test_select_and_exclude_choose_the_logged_parameters(run, tmp_path):
    _lightning_csv(tmp_path / "metrics.csv", _norms(seed=3))
    r = run("suggest-threshold", str(tmp_path / "metrics.csv"), "--select", "layer.*", "--exclude", "*bias",
            "--mode", "norm", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert list(_modes(r.json())["norm"]["per_tensor"]) == ["layer.0.weight"]


def test_a_parameter_not_logged_at_every_step_is_left_out_with_a_note(tmp_path):
    """A gap would read as a step without that gradient."""
    p = tmp_path / "metrics.csv"
    rows = ["step,grad_2.0_norm/a,grad_2.0_norm/b,grad_2.0_norm_total"]
    rows += [f"{s},1.0,{'' if s == 7 else 2.0},{math.sqrt(5)}" for s in range(20)]
    p.write_text("\n".join(rows) + "\n")
    h = read_norm_log(str(p))
    assert list(h.tensor_norms) == ["a"] and h.tensor_norms["a"] == [1.0] * 20
    assert any("per-parameter norms of b left out: not logged at every step" in n for n in h.notes)


def test_per_parameter_norms_from_json_lines_and_composer_names(tmp_path):
    p = tmp_path / "log.jsonl"
    lines = [{"step": s, "l2_norm/grad/global": 2.0 + s, "l2_norm/grad/enc.w": 1.0 + s,
              "l2_norm/grad/dec.w": 0.5} for s in range(10)]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    h = read_norm_log(str(p))
    assert h.key == "l2_norm/grad/global"
    assert h.tensor_norms == {"enc.w": [1.0 + s for s in range(10)], "dec.w": [0.5] * 10}


def test_two_logs_say_per_parameter_norms_are_read_from_one(run, tmp_path):
    _lightning_csv(tmp_path / "a.csv", _norms(seed=4))
    _lightning_csv(tmp_path / "b.csv", _norms(seed=5))
    r = run("suggest-threshold", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--format", "json")
    assert "per-parameter norms are read from one log at a time" in r.json()["cannot_derive"]["norm"]


def test_a_log_without_per_parameter_norms_still_says_it_carries_only_the_global_norm(run, tmp_path):
    p = tmp_path / "metrics.csv"
    p.write_text("step,grad_norm\n" + "".join(f"{s},{1 + s % 3}\n" for s in range(60)))
    cannot = run("suggest-threshold", str(p), "--format", "json").json()["cannot_derive"]
    assert set(cannot) == {"norm", "average-norm", "value"}
    assert all(w == "a training log carries only the global norm; per-tensor modes need gradient dumps"
               for w in cannot.values())


def test_tensorboard_scalars_of_per_parameter_norms(run, tmp_path):
    """Lightning's default logger is TensorBoard: the same names as scalar tags."""
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    norms = _norms(seed=6)
    w = EventFileWriter(str(tmp_path / "tb"))
    for s, row in enumerate(norms):
        tags = [*((f"grad_2.0_norm/{n}", v) for n, v in zip(NAMES, row)), ("grad_2.0_norm_total", _total(row))]
        w.add_event(event_pb2.Event(step=s, summary=summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=t, simple_value=v) for t, v in tags])))
    w.close()
    h = read_norm_log(str(tmp_path / "tb"))
    assert h.kind == "tensorboard" and set(h.tensor_norms) == set(NAMES)
    for i, name in enumerate(NAMES):  # TensorBoard keeps float32
        assert h.tensor_norms[name] == pytest.approx([row[i] for row in norms], rel=1e-6)
    r = run("suggest-threshold", str(tmp_path / "tb"), "--mode", "norm", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert _modes(r.json())["norm"]["largest_tensor"] == "head.weight"


def test_mlflow_runs_of_per_parameter_norms(tmp_path):
    """Lightning's MLFlowLogger: one metric per parameter, in the file store and in mlflow.db."""
    from tests.suggest.test_mlflow import T0, file_run, sql_store

    norms = _norms(steps=40, seed=7)
    metrics = {f"grad_2.0_norm/{n}": [(s, row[i]) for s, row in enumerate(norms)]
               for i, n in enumerate(NAMES)}
    metrics["grad_2.0_norm_total"] = [(s, _total(row)) for s, row in enumerate(norms)]
    metrics["grad_2.0_norm/late.weight"] = [(s, 1.0) for s in range(20, 40)]  # not at every step: left out
    file_run(tmp_path / "mlruns", "93e592b2537c4b84a16f4f55fcd2987c", "run", T0, metrics)
    sql_store(tmp_path / "mlflow.db", [("0b55e9d817cc4dab8545011f0d3487da", "run", T0, "active", metrics)])
    for store in ("mlruns", "mlflow.db"):
        h = read_norm_log(str(tmp_path / store))
        assert h.kind == "mlflow" and h.key == "grad_2.0_norm_total", store
        assert h.tensor_norms == {n: [row[i] for row in norms] for i, n in enumerate(NAMES)}, store
        assert any("per-parameter norms of late.weight left out" in n for n in h.notes), store


def test_a_wandb_run_log_of_per_parameter_norms(tmp_path):
    """Lightning's WandbLogger: the same keys in W&B's history records, steps under trainer/global_step."""
    from tests.wandb_encoder import history, write_log

    norms = _norms(steps=30, seed=8)
    recs = [history(i, i, {"trainer/global_step": 10 * s, "grad_2.0_norm_total": _total(row),
                           **{f"grad_2.0_norm/{n}": v for n, v in zip(NAMES, row)}})
            for i, (s, row) in enumerate(enumerate(norms))]
    h = read_norm_log(str(write_log(tmp_path / "run-x.wandb", recs)))
    assert h.kind == "wandb" and h.steps == [10 * s for s in range(30)]
    assert h.tensor_norms == {n: [row[i] for row in norms] for i, n in enumerate(NAMES)}


def test_per_parameter_norms_logged_on_step_and_on_epoch(tmp_path):
    """self.log_dict(grad_norm(self, 2), on_step=True, on_epoch=True): grad_2.0_norm/p.weight_step is
    p.weight's norm at each step; grad_2.0_norm/p.weight_epoch, an epoch mean, is not a parameter."""
    norms = _norms(steps=50, seed=9)
    p = tmp_path / "metrics.csv"
    head = ["step", *(f"grad_2.0_norm/{n}_step" for n in NAMES), "grad_2.0_norm_total_step",
            *(f"grad_2.0_norm/{n}_epoch" for n in NAMES), "grad_2.0_norm_total_epoch"]
    rows = [",".join(head)]
    rows += [",".join(map(str, [s, *row, _total(row)])) + "," * 4 for s, row in enumerate(norms)]
    rows.append(",".join(["49", *[""] * 4, *["1.0"] * 4]))
    p.write_text("\n".join(rows) + "\n")
    h = read_norm_log(str(p))
    assert h.key == "grad_2.0_norm_total_step"
    assert h.tensor_norms == {n: [row[i] for row in norms] for i, n in enumerate(NAMES)}
    assert not h.notes


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "csv-words", "jsonl-no-kernels"])
def test_per_parameter_norms_come_from_the_last_training_only(tmp_path, monkeypatch, fmt):
    """A log of two trainings (steps start over): the last is read, and so are its per-parameter norms
    only. A parameter the last training did not log at one of its steps is left out with a note, not
    filled in from the earlier training's row of that step (the fast paths did so; the general one not)."""
    if fmt.endswith("no-kernels"):
        monkeypatch.setenv("GRADTOOL_NO_KERNELS", "1")
    rows = [{"step": 0, "grad_2.0_norm_total": 1.0, "grad_2.0_norm/w": 5.0, "grad_2.0_norm/b": 0.5},
            {"step": 1, "grad_2.0_norm_total": 1.0, "grad_2.0_norm/w": 5.5, "grad_2.0_norm/b": 0.6},
            {"step": 0, "grad_2.0_norm_total": 2.0, "grad_2.0_norm/b": 0.7},
            {"step": 1, "grad_2.0_norm_total": 2.0, "grad_2.0_norm/w": 6.0, "grad_2.0_norm/b": 0.8}]
    if fmt.startswith("jsonl"):
        p = tmp_path / "log.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        p = tmp_path / "metrics.csv"
        header = ["step", "grad_2.0_norm_total", "grad_2.0_norm/w", "grad_2.0_norm/b"]
        cells = [[str(r.get(k, "nan")) for k in header] for r in rows]  # (nan: a number, the table whole)
        if fmt == "csv-words":  # a column of words: the fast path reads the norms' rows with the csv module
            header, cells = header + ["note"], [c + ["x"] for c in cells]
        cells[2][2] = "nan" if fmt == "csv" else "-"  # ("-": not a number, so w not logged there)
        p.write_text("\n".join(",".join(c) for c in [header, *cells]) + "\n")
    h = read_norm_log(str(p))
    assert h.steps == [0, 1] and h.norms == [2.0, 2.0]
    assert h.tensor_norms["b"] == [0.7, 0.8]
    if fmt == "csv":  # NaN logged at step 0 (a value): kept
        assert [repr(v) for v in h.tensor_norms["w"]] == ["nan", "6.0"]
    else:
        assert "w" not in h.tensor_norms and any("norms of w left out" in n for n in h.notes)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "csv-no-kernels"])
def test_per_parameter_norms_are_float64_arrays_and_their_lists(tmp_path, monkeypatch, fmt):
    """A log's per-parameter norms are kept as float64 arrays (``tensor_norm_arrays``; 10^7 Python floats
    made the wide Lightning log 1 s slower and 0.3 GB larger), read as lists through ``tensor_norms``;
    parameters logged in other rows than the rest are found at the history's steps all the same."""
    if fmt.endswith("no-kernels"):
        monkeypatch.setenv("GRADTOOL_NO_KERNELS", "1")
    rows = [{"step": s, "grad_2.0_norm_total": 1.0 + s, "grad_2.0_norm/w": 2.0 * s, "grad_inf_norm/w": 0.5}
            for s in range(6)]
    rows += [{"step": s, "grad_2.0_norm/b": 10.0 + s} for s in range(6)]  # b in rows of its own
    rows.insert(3, {"step": 9, "grad_2.0_norm/c": 1.0})  # c: never at the norm's steps (left out)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    if fmt.startswith("csv"):
        p = tmp_path / "metrics.csv"
        p.write_text("\n".join([",".join(keys), *(",".join(str(r.get(k, "")) for k in keys) for r in rows)]))
    else:
        p = tmp_path / "log.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    h = read_norm_log(str(p))
    assert h.steps == list(range(6))
    assert list(h.tensor_norm_arrays) == ["w", "b"] and "c" not in h.tensor_norms
    for name, want in (("w", [2.0 * s for s in range(6)]), ("b", [10.0 + s for s in range(6)])):
        a = h.tensor_norm_arrays[name]
        assert a.dtype == np.float64 and a.tolist() == want and h.tensor_norms[name] == want
    assert h.tensor_max_abs == {"w": [0.5] * 6} and h.tensor_max_abs_arrays["w"].dtype == np.float64
    assert h.tensor_norms is h.tensor_norms  # made once
    h.tensor_norm_arrays["w"] = np.array([1.0])  # new arrays: new lists
    assert h.tensor_norms["w"] == [1.0]
    h.tensor_norms = {"z": [3, 4]}  # set as lists: kept as arrays
    assert h.tensor_norm_arrays["z"].dtype == np.float64 and h.tensor_norms == {"z": [3.0, 4.0]}
