import csv
import io
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from gradtool import save_dump, tensor_stats


def test_json_contract(run, dump):
    r = run("stats", dump, "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    (d,) = doc["dumps"]
    for key in ("path", "format", "step", "num_tensors", "num_elements", "global_norm", "norm_type",
                "nonfinite_tensors", "tensors"):
        assert key in d
    assert d["format"] == "npz" and d["step"] == 5 and d["num_tensors"] == 3 and d["num_elements"] == 9
    assert d["global_norm"] == pytest.approx(math.sqrt(245), rel=1e-15)  # ints are not counted
    assert d["norm_type"] == 2 and d["nonfinite_tensors"] == []
    t = {x["name"]: x for x in d["tensors"]}
    for key in ("name", "shape", "dtype", "size", "norm", "avg_norm", "max_abs", "mean", "std", "nan_count",
                "inf_count", "zero_count"):
        assert key in t["a/w"]
    from gradtool.cli.stats import TENSOR_FIELDS

    assert all(list(x) == TENSOR_FIELDS for x in d["tensors"])  # every field, in the documented order
    a = tensor_stats(np.array([[-2.0, 3.0, 6.0]], np.float32))  # a/w, as the `dump` fixture saves it
    assert {k: t["a/w"][k] for k in TENSOR_FIELDS[2:]} == {k: getattr(a, k) for k in TENSOR_FIELDS[2:]}
    assert t["a/w"]["shape"] == [1, 3] and t["a/w"]["dtype"] == "float32" and t["a/w"]["norm"] == 7.0
    assert t["attn[weight]"]["avg_norm"] == pytest.approx(14 / 3)
    # one code path: the same numbers as the library function
    s = tensor_stats(np.array([-4.0, 6.0, 12.0]))
    assert t["attn[weight]"]["std"] == s.std and t["attn[weight]"]["mean"] == s.mean


def test_complex_tensor_is_summarised_by_its_moduli_without_a_warning(run, tmp_path):
    p = str(tmp_path / "c.npz")
    np.savez(p, z=np.array([3j, 4j], np.complex64), w=np.array([1.0, 2.0], np.float32))
    r = run("stats", p, "--format", "json")
    assert r.exit_code == 0 and r.stderr == ""  # NumPy's ComplexWarning was printed here
    t = {x["name"]: x for x in r.json()["dumps"][0]["tensors"]}
    assert t["z"]["norm"] == 5.0 and t["z"]["max_abs"] == 4.0 and t["z"]["zero_count"] == 0
    assert t["z"]["mean"] is None and t["z"]["std"] is None and t["z"]["dtype"] == "complex64"


def test_table_says_which_tensors_the_global_norm_leaves_out(run, dump, tmp_path):
    """It said "over 3 tensors, 9 elements" of a norm over two of them (the integer one is not counted)."""
    r = run("stats", dump)
    assert r.exit_code == 0
    assert "global norm 15.6525 over 2 floating-point tensors, 6 elements (not counted: count)" in r.stdout
    floats = str(tmp_path / "floats.npz")
    save_dump(floats, {"w": np.ones(4, np.float32)})
    assert "global norm 2 over 1 tensors, 4 elements\n" in run("stats", floats).stdout


def test_strict_json_for_nonfinite(run, nan_dump):
    r = run("stats", nan_dump, "--format", "json")
    assert r.exit_code == 0
    assert "NaN" in r.stdout
    doc = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    d = doc["dumps"][0]
    assert d["global_norm"] == "NaN" and d["nonfinite_tensors"] == ["bad"]
    bad = [t for t in d["tensors"] if t["name"] == "bad"][0]
    assert bad["nan_count"] == 1 and bad["inf_count"] == 1 and bad["max_abs"] == "Infinity"


def test_fail_on_nonfinite_exit_3(run, nan_dump, dump):
    r = run("stats", "--fail-on-nonfinite", nan_dump, dump, "--format", "json")
    assert r.exit_code == 3
    assert "bad" in r.stderr and "step 7" in r.stderr
    assert json.loads(r.stdout)["dumps"]  # data still printed
    assert run("stats", "--fail-on-nonfinite", dump).exit_code == 0


def test_norm_type(run, dump):
    d1 = run("stats", dump, "--format", "json", "--norm-type", "1").json()["dumps"][0]
    assert d1["norm_type"] == 1 and d1["global_norm"] == 11 + 22
    di = run("stats", dump, "--format", "json", "--norm-type", "inf").json()["dumps"][0]
    assert di["norm_type"] == "inf" and di["global_norm"] == 12


def test_select_exclude_sort_top(run, dump):
    d = run("stats", dump, "--format", "json", "--select", "a/*", "--select", "attn*").json()["dumps"][0]
    assert [t["name"] for t in d["tensors"]] == ["a/w", "attn[weight]"]
    d = run("stats", dump, "--format", "json", "--exclude", "attn*").json()["dumps"][0]
    assert [t["name"] for t in d["tensors"]] == ["a/w", "count"] and d["global_norm"] == 7.0
    d = run("stats", dump, "--format", "json", "--sort", "norm", "--top", "1").json()["dumps"][0]
    assert [t["name"] for t in d["tensors"]] == ["attn[weight]"]
    d = run("stats", dump, "--format", "json", "--sort", "name").json()["dumps"][0]
    assert [t["name"] for t in d["tensors"]] == ["a/w", "attn[weight]", "count"]


@pytest.mark.parametrize("fmt,delim", [("csv", ","), ("tsv", "\t")])
def test_csv_tsv(run, dump, fmt, delim):
    r = run("stats", dump, "--format", fmt)
    rows = list(csv.DictReader(io.StringIO(r.stdout), delimiter=delim))
    assert len(rows) == 3 and rows[0]["name"] == "a/w" and float(rows[0]["norm"]) == 7.0
    assert rows[1]["name"] == "attn[weight]" and rows[1]["step"] == "5"
    assert repr(float(rows[1]["avg_norm"])) == rows[1]["avg_norm"]  # full precision


def test_jsonl(run, dump):
    lines = run("stats", dump, "--format", "jsonl").stdout.splitlines()
    objs = [json.loads(x) for x in lines]
    assert len(objs) == 3 and all(o["path"] == dump and o["step"] == 5 for o in objs)


def test_table_prints_names_as_themselves(run, dump):
    r = run("stats", dump)
    assert r.exit_code == 0
    assert "attn[weight]" in r.stdout and "global norm" in r.stdout
    assert r.stderr == ""


def test_history_table_and_sparkline(run, history):
    r = run("stats", history)
    assert r.exit_code == 0
    assert "6 steps" in r.stdout and any(ch in r.stdout for ch in "▁▂▃▄▅▆▇█")
    d = run("stats", history, "--format", "json").json()["dumps"]
    assert [x["step"] for x in d] == [0, 1, 2, 3, 4, 5]
    assert max(d, key=lambda x: x["global_norm"])["step"] == 3


def test_multistep_h5(run, tmp_path):
    from gradtool import Recorder

    rec = Recorder(str(tmp_path / "run.h5"))
    for s in (1, 2, 3):
        rec.write(s * 10, {"w": np.full(4, float(s))})
    d = run("stats", str(tmp_path / "run.h5"), "--format", "json").json()["dumps"]
    assert [x["step"] for x in d] == [10, 20, 30] and [x["global_norm"] for x in d] == [2.0, 4.0, 6.0]


def test_errors_bad_input_and_usage(run, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04garbage")
    r = run("stats", str(bad))
    assert r.exit_code == 1 and r.stderr.startswith("gradtool: error:") and "bad.npz" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert run("stats", str(tmp_path / "missing.npz")).exit_code == 1
    assert run("stats", "--norm-type", "3", str(bad)).exit_code == 2
    assert run("stats").exit_code == 2
    assert run("stats", "x.npz", "--backend", "cupy").exit_code == 2


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_head_closes_pipe_quietly(tmp_path, unbuffered):
    """Also under PYTHONUNBUFFERED=1, where a write(2) the reader's leaving cut short was dropped without
    an error (TextIOWrapper over the raw file): exit 0 for a cut output (JSON: one write of the whole)."""
    p = str(tmp_path / "many.npz")
    save_dump(p, {f"t{i}": np.ones(3) for i in range(3000)})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | (
        {"PYTHONUNBUFFERED": unbuffered} if unbuffered else {})
    for _ in range(3):  # (the race the buffering decided: the reader gone during a write, or before one)
        for fmt in ("csv", "table", "json"):
            gradtool = f"{sys.executable} -m gradtool stats {p} --format {fmt}"
            script = f'{gradtool} | head -1; echo "exit ${{PIPESTATUS[0]}}"'
            proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
            first, status = proc.stdout.splitlines()
            assert first.startswith({"csv": "path,", "table": p, "json": "{"}[fmt])
            assert proc.stderr == ""
            assert status == "exit 1", fmt  # the output was cut: not a success (README: exit codes)


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_reader_gone_before_the_first_write_is_met_quietly(tmp_path, fmt, unbuffered):
    """The race above decided one way every time: the pipe's reader closed before gradtool writes. click
    met the EPIPE itself and left by sys.exit(1), past gradtool's clean-up, so the stdout buffer's close
    at exit printed "Exception ignored ... BrokenPipeError" (Python 3.13, PYTHONUNBUFFERED=1: every run)."""
    p = str(tmp_path / "many.npz")
    save_dump(p, {f"t{i}": np.ones(3) for i in range(3000)})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | (
        {"PYTHONUNBUFFERED": unbuffered} if unbuffered else {})
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "gradtool", "stats", p, "--format", fmt], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (1, "")


def test_stdin(run, dump):
    with open(dump, "rb") as f:
        data = f.read()
    r = run("stats", "-", "--format", "json", input=data)
    assert r.exit_code == 0, r.stderr
    assert r.json()["dumps"][0]["path"] == "<stdin>" and r.json()["dumps"][0]["step"] == 5


@pytest.mark.parametrize("ext", ["npz", "h5", "safetensors", "npy"])
def test_every_format(run, tmp_path, ext):
    a = np.array([[3.0, 4.0]], np.float32)
    p = str(tmp_path / f"step_00042.{ext}")
    if ext == "npy":
        np.save(p, a)
    else:
        save_dump(p, {"w": a, "attn[weight]": np.array([0.0, np.nan], np.float16)})
    d = run("stats", p, "--format", "json").json()["dumps"][0]
    fmt = {"h5": "hdf5"}.get(ext, ext)
    assert d["format"] == fmt and d["step"] == 42
    t = {x["name"]: x for x in d["tensors"]}
    name = "step_00042" if ext == "npy" else "w"
    assert t[name]["norm"] == 5.0 and t[name]["shape"] == [1, 2]
    if ext != "npy":
        assert t["attn[weight]"]["nan_count"] == 1 and d["nonfinite_tensors"] == ["attn[weight]"]
        assert "attn[weight]" in run("stats", p).stdout


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_history_steps_from_metadata_then_filename_then_order_with_each_dump_opened_once(run, tmp_path, monkeypatch,
                                                                                         engine):
    """stats takes each dump's step while it reads it (one open per dump, not one more to find the step),
    by the rule expand_inputs documents: metadata, else the file name's number, else the position."""
    if engine == "dask":
        pytest.importorskip("dask.distributed")
    from gradtool.io import history

    files = [("a_step_00100.npz", None), ("b_named_7.h5", {"step": 3}), ("c_nonumber.safetensors", None),
             ("d_final.npz", {"step": "not an int"})]
    for name, meta in files:
        save_dump(str(tmp_path / name), {"w": np.ones(2, np.float32)}, meta)
    paths = [str(tmp_path / n) for n, _ in files]
    expected = [r.step for r in history.expand_inputs(paths)]
    assert expected == [100, 3, 2, 3]
    opened = []
    real_open = history.DumpRef.open
    monkeypatch.setattr(history.DumpRef, "open", lambda self: opened.append(self.path) or real_open(self))
    args = ["stats", *paths, "--format", "json"] + (["--engine", "dask"] if engine == "dask" else [])
    d = run(*args).json()["dumps"]
    assert [x["step"] for x in d] == sorted(expected)  # a history in step order; equal steps as given
    assert [x["path"] for x in d] == [paths[2], paths[1], paths[3], paths[0]]
    if engine == "local":
        assert opened == paths
    one = run("stats", paths[2], "--format", "json").json()["dumps"]  # one dump: the file's position, 0
    assert [x["step"] for x in one] == [0]


def test_a_cut_history_table_says_which_steps_it_shows(run, history):
    """`--top N` without `--sort norm` shows the first N steps, and the heading used to say only "6 steps"."""
    out = run("stats", history, "--top", "2").stdout.splitlines()
    assert out[0] == "6 steps (the first 2; --sort norm for the largest)"
    assert [line.split()[0] for line in out[2:4]] == ["0", "1"]
    out = run("stats", history, "--top", "2", "--sort", "norm").stdout.splitlines()
    assert out[0] == "6 steps (top 2 by global norm)" and out[2].split()[0] == "3"  # the 100x step
    assert run("stats", history).stdout.splitlines()[0] == "6 steps"
    assert run("stats", history, "--top", "6").stdout.splitlines()[0] == "6 steps"


def test_the_history_sparkline_fits_a_narrow_terminal(run, monkeypatch):
    """400 steps on a 50-column terminal: a sparkline of 50 buckets on one line (80 were folded in two);
    piped (200 columns), 80 as before."""
    import io
    import pathlib

    from rich.console import Console

    from gradtool.cli import render

    sample = str(pathlib.Path(__file__).resolve().parents[2] / "sample_data" / "run.h5")
    for width, expected in ((50, 50), (200, 80)):
        buf = io.StringIO()
        monkeypatch.setattr(render, "console", lambda stderr=False, w=width, b=buf: Console(
            file=b, markup=False, highlight=False, emoji=False, width=w, soft_wrap=False, color_system=None))
        assert run("stats", sample).exit_code == 0
        lines = buf.getvalue().splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("min "))
        assert len(lines[at - 1]) == expected and set(lines[at - 1]) <= set("▁▂▃▄▅▆▇█!")
        assert "NaN/Inf):" in lines[at - 2]  # the line (or the fold of the line) that introduces it
