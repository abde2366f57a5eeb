"""DVCLive logs (``report_to="dvclive"``; DVCLive's Lightning logger): one ``step <name>`` TSV per metric
under ``dvclive/plots/metrics/``, written here the way DVCLive's ``Metric.dump`` writes them (csv.DictWriter,
tab-separated, header once, the column named after the last part of the metric's name; checked against
dvclive 3.49), with a ``timestamp`` column first when asked for (and always in older versions)."""

import csv
import math

import pytest

from gradtool.errors import InputError
from gradtool.io.logs import read_norm_log


def _write_metric(log_dir, name, rows, timestamp=False):
    path = log_dir / "plots" / "metrics" / f"{name}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    column = name.rsplit("/", 1)[-1]
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, ["timestamp"] * timestamp + ["step", column], delimiter="\t",
                                lineterminator="\n")
        writer.writeheader()
        for step, value in rows:
            writer.writerow({"timestamp": 1700000000000 + step, "step": step, column: value}
                            if timestamp else {"step": step, column: value})
    return path


def _trainer_log(log_dir, calls=40, timestamp=False):
    """The Trainer's callback: one DVCLive step per log call, an evaluation every 10th call (eval/loss,
    no grad_norm), names as DVCLive's standardize_metric_name leaves them (grad_norm, eval/loss)."""
    train = [c for c in range(calls) if c % 10 != 9]
    _write_metric(log_dir, "grad_norm", [(c, 1.0 + c / 100) for c in train], timestamp)
    _write_metric(log_dir, "loss", [(c, 3.0 - c / 100) for c in train], timestamp)
    _write_metric(log_dir, "learning_rate", [(c, 1e-4) for c in train], timestamp)
    _write_metric(log_dir, "epoch", [(c, c / calls) for c in range(calls)], timestamp)
    _write_metric(log_dir, "eval/loss", [(c, 2.0) for c in range(9, calls, 10)], timestamp)
    return train


@pytest.mark.parametrize(("where", "timestamp"), [("project", False), ("dvclive", True),
                                                   ("plots/metrics", False)])
def test_the_trainers_dvclive_log_is_read_joined_by_step(tmp_path, run, where, timestamp):
    # the project directory (dvclive/ in it), the log's directory or its plots/metrics: the same history;
    # the steps count log calls, which the output says (and marks as not training steps)
    train = _trainer_log(tmp_path / "dvclive", timestamp=timestamp)
    path = {"project": tmp_path, "dvclive": tmp_path / "dvclive",
            "plots/metrics": tmp_path / "dvclive" / "plots" / "metrics"}[where]
    h = read_norm_log(str(path))
    assert h.kind == "dvclive" and h.key == "grad_norm" and h.steps == train
    assert h.norms == [1.0 + c / 100 for c in train] and h.loss == [3.0 - c / 100 for c in train]
    assert h.lr == [1e-4] * len(train) and h.line_order
    assert any("count the Hugging Face Trainer's log calls" in n for n in h.notes)
    r = run("suggest-threshold", str(path), "--format", "json")
    assert r.exit_code == 0 and r.json()["source"]["kind"] == "dvclive"
    assert any("log calls" in w for w in r.json()["history"]["warnings"])
    r = run("stats", str(path))  # not dumps: says what reads it
    assert r.exit_code == 1
    assert "it holds training logs (a DVCLive log): suggest-threshold reads them" in r.stderr


@pytest.mark.parametrize("norm", ["grad_2.0_norm_total", "grad/total/2.0_norm"])
def test_dvclives_lightning_log_keeps_its_steps(tmp_path, norm):
    # DVCLive's Lightning logger sets its step to the trainer's global step; Lightning's
    # grad_2.0_norm_total keeps its name (dvclive 3.49), older DVCLive named it grad/total/2.0_norm;
    # a NaN norm stays NaN
    log = tmp_path / "dvclive"
    _write_metric(log, norm, [(50, 1.5), (100, "nan"), (150, 2.5)])
    _write_metric(log, "train/step/loss", [(50, 3.0), (100, 2.9), (150, 2.8)])
    _write_metric(log, "epoch", [(50, 0), (100, 0), (150, 1)])
    h = read_norm_log(str(log))
    assert h.key == norm and h.steps == [50, 100, 150] and not h.line_order
    assert h.norms[0] == 1.5 and math.isnan(h.norms[1]) and h.norms[2] == 2.5 and not h.notes


def test_a_cut_last_line_and_a_step_logged_again_in_a_dvclive_log(tmp_path):
    # a run killed mid-write leaves half a line; a resumed run (Live(resume=True)) logs a step again:
    # the half line is skipped, the later value kept
    log = tmp_path / "dvclive"
    path = _write_metric(log, "grad_norm", [(0, 1.0), (1, 2.0), (1, 2.5)])
    with open(path, "a") as f:
        f.write("2\t")
    h = read_norm_log(str(log))
    assert h.steps == [0, 1] and h.norms == [1.0, 2.5]


def test_a_dvclive_log_without_a_norm_or_with_a_foreign_file(tmp_path, run):
    log = tmp_path / "dvclive"
    _write_metric(log, "loss", [(0, 3.0)])
    _write_metric(log, "learning_rate", [(0, 1e-4)])
    r = run("suggest-threshold", str(log))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    assert "DVCLive log with no gradient-norm metric (metrics: learning_rate, loss)" in r.stderr
    assert "transformers 4.38" in r.stderr
    assert read_norm_log(str(log), key="loss").norms == [3.0]  # --key names any metric
    r = run("suggest-threshold", str(log), "--key", "gnorm")
    assert r.exit_code == 2
    assert "DVCLive log with no metric 'gnorm' (metrics: learning_rate, loss)" in r.stderr
    bad = log / "plots" / "metrics" / "grad_norm.tsv"
    bad.write_text("step,grad_norm\n0,1.0\n")  # commas in a .tsv: one column
    with pytest.raises(InputError, match=r"grad_norm.tsv: not a DVCLive metric file"):
        read_norm_log(str(log))
    r = run("suggest-threshold", str(log))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
