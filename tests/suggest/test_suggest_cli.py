import json
import math
import os

import numpy as np
import pytest

from gradtool import Recorder

REAL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "real-logs")


@pytest.fixture
def run_h5(tmp_path):
    """A 200-step history of a 3-tensor model with two injected spikes and a NaN step."""
    rng = np.random.default_rng(0)
    rec = Recorder(str(tmp_path / "run.h5"))
    for s in range(200):
        k = 30.0 if s in (120, 170) else 1.0
        g = {"emb": rng.standard_normal((20, 8)).astype(np.float32) * 0.1 * k,
             "rnn/w": rng.standard_normal((8, 8)).astype(np.float32) * 0.5 * k,
             "out/b": rng.standard_normal(4).astype(np.float32) * 0.05 * k}
        if s == 150:
            g["out/b"][0] = np.nan
        rec.write(s, g, loss=2.0 - s / 400)
    return str(tmp_path / "run.h5")


def test_dumps_give_every_mode_consistently(run, run_h5):
    r = run("suggest-threshold", run_h5, "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    modes = {m["mode"]: m for m in doc["modes"]}
    assert set(modes) == {"global-norm", "norm", "average-norm", "value"}
    g = modes["global-norm"]["threshold"]
    assert g >= modes["norm"]["threshold"] >= modes["average-norm"]["threshold"]
    assert g >= modes["value"]["threshold"]
    assert doc["history"]["nonfinite_steps"] == [150]
    spikes = {s["step"] for s in modes["global-norm"]["spikes"]}
    assert {120, 170} <= spikes
    assert set(modes["norm"]["per_tensor"]) == {"emb", "rnn/w", "out/b"}
    for key in ("clip_rate_window", "clip_rate_all", "percentile", "zscore", "ratio_to_mean", "spikes"):
        assert key in modes["global-norm"]
    json.loads(r.stdout, parse_constant=lambda c: pytest.fail("bare NaN/Infinity"))


def test_format_value_prints_exactly_one_number(run, run_h5):
    r = run("suggest-threshold", run_h5, "--mode", "global-norm", "--format", "value")
    assert r.exit_code == 0
    assert len(r.stdout.split()) == 1 and math.isfinite(float(r.stdout))
    assert run("suggest-threshold", run_h5, "--format", "value").exit_code == 2  # several modes


def test_value_feeds_clip_and_stats_confirms(run, run_h5, tmp_path):
    tau = float(run("suggest-threshold", run_h5, "--mode", "global-norm", "--format", "value").stdout)
    out = str(tmp_path / "clipped.h5")
    r = run("clip", run_h5, "-o", out, "--mode", "global-norm", "--max", repr(tau), "--nonfinite", "zero")
    assert r.exit_code == 0, r.stderr
    d = run("stats", out, "--format", "json").json()["dumps"]
    assert all(x["global_norm"] <= tau * (1 + 1e-6) for x in d)


def test_per_tensor_thresholds_roundtrip_into_clip(run, run_h5, tmp_path):
    th = str(tmp_path / "th.json")
    r = run("suggest-threshold", run_h5, "--per-tensor", "-o", th, "--format", "json")
    assert r.exit_code == 0, r.stderr
    table = json.load(open(th))["thresholds"]
    assert set(table) == {"norm", "average-norm", "value"} and "rnn/w" in table["norm"]
    out = str(tmp_path / "c.h5")
    r = run("clip", run_h5, "-o", out, "--mode", "norm", "--thresholds", th, "--nonfinite", "zero", "--format", "json")
    assert r.exit_code == 0, r.stderr
    for d in r.json()["dumps"]:
        for t in d["tensors"]:
            assert t["norm_after"] <= table["norm"][t["name"]] * (1 + 1e-6)
    assert run("suggest-threshold", run_h5, "--per-tensor", "-o", th).exit_code == 2  # exists, no --force


def test_per_tensor_thresholds_of_global_norm_alone_are_refused_saying_which_modes_have_them(run, run_h5,
                                                                                           tmp_path):
    """--mode global-norm has no per-tensor thresholds: said before the dumps are read (it was "--per-tensor
    needs gradient dumps (a log carries only the global norm)", given dumps, after reading them all)."""
    th = str(tmp_path / "th.json")
    r = run("suggest-threshold", run_h5, "--per-tensor", "-o", th, "--mode", "global-norm")
    assert r.exit_code == 2 and "--mode global-norm has none" in r.stderr and "--mode norm" in r.stderr
    assert not os.path.exists(th)
    log = tmp_path / "log.jsonl"  # a log of the global norm only: it says so
    log.write_text("".join(json.dumps({"step": s, "grad_norm": 1.0 + (s % 7) / 10}) + "\n"
                           for s in range(60)))
    r = run("suggest-threshold", str(log), "--per-tensor", "-o", th)
    assert r.exit_code == 2 and "this log carries only the global norm" in r.stderr and not os.path.exists(th)


@pytest.mark.skipif(not os.path.isdir(REAL), reason="../shared/real-logs not present")
def test_log_input_says_what_cannot_be_derived(run):
    p = os.path.join(REAL, "medbot_trainer_state.json")
    r = run("suggest-threshold", p, "--format", "json", "--current", "1.0")
    doc = r.json()
    assert [m["mode"] for m in doc["modes"]] == ["global-norm"]
    assert set(doc["cannot_derive"]) == {"norm", "average-norm", "value"}
    assert doc["modes"][0]["current"]["clip_rate_all"] > 0.5  # the copied 1.0 clips most steps of this run
    assert run("suggest-threshold", p, "--mode", "norm").exit_code == 2
    r = run("suggest-threshold", p, "--format", "value")  # only one mode possible: fine
    assert r.exit_code == 0 and float(r.stdout) > 0
    r = run("suggest-threshold", p)
    assert r.exit_code == 0 and "τ" in r.stdout and "cannot be derived" in r.stdout


def test_no_threshold_exit_4(run, tmp_path):
    p = tmp_path / "short.csv"
    p.write_text("step,grad_norm\n1,1.0\n2,2.0\n")
    r = run("suggest-threshold", str(p))
    assert r.exit_code == 4 and "too little" in r.stderr
    r = run("suggest-threshold", str(p), "--format", "value")
    assert r.exit_code == 4 and r.stdout == ""


def test_log_with_dumps_adds_loss(run, run_h5, tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text("\n".join(json.dumps({"step": s, "grad_norm": 1.0, "loss": 3.0, "lr": 1e-3}) for s in range(200)))
    doc = run("suggest-threshold", run_h5, str(p), "--format", "json").json()
    assert doc["history"]["has_lr"] and doc["source"]["kind"] == "dumps"


@pytest.mark.parametrize("source", ["dumps", "csv log"])
def test_plot(run, run_h5, tmp_path, source):
    """--plot from dumps (lists) and from a CSV log (arrays, with a NaN step)."""
    pytest.importorskip("matplotlib")
    if source == "csv log":
        log = tmp_path / "log.csv"
        log.write_text("step,grad_norm\n" + "".join(f"{i},{'nan' if i == 50 else 1 + i % 5}\n" for i in range(120)))
        run_h5 = str(log)
    png = str(tmp_path / "h.png")
    r = run("suggest-threshold", run_h5, "--mode", "global-norm", "--plot", png)
    assert r.exit_code == 0, r.stderr
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_methods_on_cli(run, run_h5):
    for method in ("percentile", "zscore", "pascanu"):
        r = run("suggest-threshold", run_h5, "--mode", "global-norm", "--method", method, "--format", "value")
        assert r.exit_code == 0 and float(r.stdout) > 0


def test_no_warm_up_skipped_is_said_so_not_to_step_none(run, run_h5):
    r = run("suggest-threshold", run_h5, "--burn-in", "0")
    assert r.exit_code == 0, r.stderr
    assert "- warm-up skipped: none (given with --burn-in)" in r.stdout and "step None" not in r.stdout
    r = run("suggest-threshold", run_h5, "--burn-in", "30")
    assert "- warm-up skipped: 30 observations (to step 29)" in r.stdout


def test_no_per_tensor_threshold_writes_no_empty_table(run, tmp_path):
    """Every tensor is non-zero at only 6 steps (too few for a per-tensor threshold) while the global norm
    is fine at all 72: the thresholds file used to be written with empty tables (exit 0), which a later
    `clip --thresholds` read as 'clip nothing'."""
    rec = Recorder(str(tmp_path / "run.h5"))
    rng = np.random.default_rng(1)
    for s in range(72):
        rec.write(s, {f"t{k}": (rng.standard_normal(4) if k == s // 6 else np.zeros(4)).astype(np.float32)
                      for k in range(12)})
    th = str(tmp_path / "th.json")
    r = run("suggest-threshold", str(tmp_path / "run.h5"), "--burn-in", "0", "--per-tensor", "-o", th,
            "--format", "json")
    assert r.exit_code == 4, r.stderr
    assert next(m for m in r.json()["modes"] if m["mode"] == "global-norm")["threshold"] > 0
    assert "no per-tensor threshold could be derived" in r.stderr and "th.json was not written" in r.stderr
    assert not os.path.exists(th)


def test_clip_refuses_thresholds_that_fit_nothing(run, run_h5, tmp_path):
    th = str(tmp_path / "th.json")
    assert run("suggest-threshold", run_h5, "--per-tensor", "-o", th, "--mode", "norm").exit_code == 0
    out = str(tmp_path / "out.h5")
    r = run("clip", run_h5, "-o", out, "--mode", "value", "--thresholds", th)
    assert r.exit_code == 1 and "no per-tensor thresholds for --mode value (it has: norm)" in r.stderr
    other = str(tmp_path / "other.json")
    with open(other, "w") as f:
        json.dump({"thresholds": {"norm": {"encoder/typo": 1.0}}}, f)
    r = run("clip", run_h5, "-o", out, "--mode", "norm", "--thresholds", other)
    assert r.exit_code == 2
    assert "none of its tensor names (encoder/typo) is a tensor of any of the 200 dumps" in r.stderr
    assert not os.path.exists(out)
    # with --max for the tensors the table does not name, a table for other tensors is fine
    r = run("clip", run_h5, "--dry-run", "--mode", "norm", "--thresholds", other, "--max", "1",
            "--nonfinite", "zero")
    assert r.exit_code == 0, r.stderr


def test_a_log_with_several_norm_columns_says_which_it_took(run, tmp_path):
    """A W&B export of two runs has a norm column per run; the first was taken without a word."""
    rng = np.random.default_rng(4)
    p = tmp_path / "export.csv"
    lines = ["Step,run-a - train/grad_norm,run-a - train/grad_norm__MIN,run-a - train/grad_norm__MAX,"
             "run-b - train/grad_norm"]
    lines += [f"{s},{a},{a},{a},{5 * a}" for s, a in enumerate(np.abs(rng.normal(1, 0.1, 120)) + 0.01, 1)]
    p.write_text("\n".join(lines) + "\n")
    doc = run("suggest-threshold", str(p), "--format", "json").json()
    assert doc["source"]["key"] == "run-a - train/grad_norm"
    assert doc["history"]["warnings"][0] == (
        f"{p}: the norm was taken from 'run-a - train/grad_norm', but 'run-b - train/grad_norm' holds a "
        "gradient norm too (another run?); choose one with --run RUN (a W&B export's runs) or --key")
    table = run("suggest-threshold", str(p)).stdout
    assert "'run-b - train/grad_norm' holds a gradient norm too" in table
    chosen = run("suggest-threshold", str(p), "--key", "run-b - train/grad_norm", "--format", "json").json()
    assert not any("another run" in w for w in chosen["history"]["warnings"])
    assert chosen["modes"][0]["threshold"] == pytest.approx(5 * doc["modes"][0]["threshold"], rel=1e-9)
    by_run = run("suggest-threshold", str(p), "--run", "run-b", "--format", "json").json()
    assert by_run["source"]["key"] == "run-b - train/grad_norm" and by_run["source"]["run"]["name"] == "run-b"
    assert by_run["modes"] == chosen["modes"] and not by_run["history"]["warnings"]
    r = run("suggest-threshold", str(p), "--run", "run-c")
    assert r.exit_code == 2 and "no run 'run-c' among its 2 runs in its columns ('RUN - metric') ('run-a', " \
                                "'run-b')" in r.stderr
    q = tmp_path / "plain.csv"
    q.write_text("step,grad_norm\n" + "".join(f"{s},{1 + s % 3}\n" for s in range(1, 60)))
    r = run("suggest-threshold", str(q), "--run", "x")
    assert r.exit_code == 2 and "holds no runs in its columns" in r.stderr
    for other in ("grad_norm_clipped", "grad_norm/layer.0"):  # not a second global norm
        q = tmp_path / "one.csv"
        q.write_text(f"step,grad_norm,{other}\n" + "".join(f"{s},{1 + s % 3},{s}\n" for s in range(1, 60)))
        assert not run("suggest-threshold", str(q), "--format", "json").json()["history"]["warnings"]


def test_a_step_recorded_twice_counts_once_the_last_dump_given(run, tmp_path):
    """A resumed run records steps again; they were two observations each, side by side in the series."""
    from gradtool import save_dump

    rng = np.random.default_rng(8)
    first, again, expected = tmp_path / "first", tmp_path / "again", tmp_path / "expected"
    for d in (first, again, expected):
        d.mkdir()
    for s in range(80):
        w = {"w": rng.standard_normal(16).astype(np.float32)}
        save_dump(str(first / f"step_{s:03d}.npz"), w, {"step": s})
        if s < 50:
            save_dump(str(expected / f"step_{s:03d}.npz"), w, {"step": s})
    for s in range(50, 80):
        w = {"w": 2 * rng.standard_normal(16).astype(np.float32)}
        save_dump(str(again / f"step_{s:03d}.npz"), w, {"step": s})
        save_dump(str(expected / f"step_{s:03d}.npz"), w, {"step": s})
    doc = run("suggest-threshold", str(first), str(again), "--format", "json").json()
    ref = run("suggest-threshold", str(expected), "--format", "json").json()
    assert doc["history"]["n"] == ref["history"]["n"] == 80
    assert doc["history"]["warnings"][0] == ("30 step(s) recorded in more than one dump (50, 51, 52, 53, 54, "
                                             "...); the dump given last for each is used (a resumed run "
                                             "recorded again?)")
    assert [m["threshold"] for m in doc["modes"]] == [m["threshold"] for m in ref["modes"]]
    assert not any("more than one dump" in w for w in ref["history"]["warnings"])


def test_kubectl_logs_of_a_hugging_face_trainer_through_a_pipe(run, tmp_path):
    """The README's `kubectl logs trainer-0 | gradtool suggest-threshold -`, with what such logs hold."""
    from tests.suggest.test_logs import _hf_console

    p = tmp_path / "train.log"
    _hf_console(p, n=300, spike=200)
    doc = run("suggest-threshold", "-", "--format", "json", input=p.read_bytes()).json()
    assert doc["source"]["kind"] == "console" and doc["history"]["n"] == 300
    assert doc["history"]["warnings"][0].startswith("<stdin>: the log gives no step numbers")
    g = doc["modes"][0]
    assert g["mode"] == "global-norm" and 1.6 < g["threshold"] < 21.0
    assert [s["step"] for s in g["spikes"]] == [200]


def test_plot_of_a_log_without_step_numbers_says_what_its_x_axis_is(run, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    from tests.suggest.test_logs import _hf_console

    labels = []
    real = matplotlib.axes.Axes.set_xlabel
    monkeypatch.setattr(matplotlib.axes.Axes, "set_xlabel", lambda self, text, *a, **k: labels.append(text)
                        or real(self, text, *a, **k))
    log = tmp_path / "train.log"
    _hf_console(log, n=200, spike=150)
    r = run("suggest-threshold", str(log), "--plot", str(tmp_path / "h.png"))
    assert r.exit_code == 0, r.stderr
    assert "line in the log (it gives no step numbers)" in labels
    labels.clear()
    csv = tmp_path / "m.csv"
    csv.write_text("step,grad_norm\n" + "".join(f"{i},{1 + i % 5}\n" for i in range(120)))
    run("suggest-threshold", str(csv), "--plot", str(tmp_path / "c.png"))
    assert "step" in labels and not any("line" in x for x in labels)
