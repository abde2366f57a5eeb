import hashlib
import json
import math
import os

import numpy as np
import pytest

from gradtool import clip_by_global_norm, clip_by_norm, open_dump, save_dump


def sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def read_all(p):
    with open_dump(p) as r:
        return {n: r.read(n) for n in r.names}, dict(r.metadata)


def test_global_norm_seed_example(run, dump, tmp_path):
    out = str(tmp_path / "out.npz")
    before = sha(dump)
    r = run("clip", dump, "-o", out, "--mode", "global-norm", "--max", "14.5", "--format", "json")
    assert r.exit_code == 0, r.stderr
    (d,) = r.json()["dumps"]
    for key in ("input", "output", "mode", "max", "min", "global_norm_before", "global_norm_after", "scale",
                "clipped_tensors", "tensors"):
        assert key in d
    assert d["global_norm_before"] == pytest.approx(math.sqrt(245), rel=1e-15)
    assert d["scale"] == pytest.approx(14.5 / math.sqrt(245), rel=1e-15)
    assert d["global_norm_after"] == pytest.approx(14.5, rel=1e-6) and d["clipped_tensors"] == 2
    got, meta = read_all(out)
    src, _ = read_all(dump)
    ref, _ = clip_by_global_norm([src["a/w"], src["attn[weight]"]], 14.5)
    assert got["a/w"].tobytes() == ref[0].tobytes() and got["attn[weight]"].tobytes() == ref[1].tobytes()
    np.testing.assert_allclose(got["attn[weight]"], [-3.7055, 5.5582, 11.1165], atol=1e-4)
    assert got["count"].tobytes() == src["count"].tobytes() and meta["step"] == 5
    assert sha(dump) == before  # input untouched


def test_norm_mode_unclipped_bit_identical(run, dump, tmp_path):
    out = str(tmp_path / "n.npz")
    r = run("clip", dump, "-o", out, "--mode", "norm", "--max", "9", "--format", "json")
    t = {x["name"]: x for x in r.json()["dumps"][0]["tensors"]}
    assert t["a/w"]["clipped"] is False and t["attn[weight]"]["clipped"] is True
    assert t["count"]["skipped"] == "not floating point"
    got, _ = read_all(out)
    src, _ = read_all(dump)
    assert got["a/w"].tobytes() == src["a/w"].tobytes()
    assert got["attn[weight]"].tobytes() == clip_by_norm(src["attn[weight]"], 9.0).tobytes()


def test_value_mode_default_min(run, dump, tmp_path):
    out = str(tmp_path / "v.npz")
    r = run("clip", dump, "-o", out, "--mode", "value", "--max", "3", "--format", "json")
    d = r.json()["dumps"][0]
    assert d["min"] == -3.0 and d["max"] == 3.0
    got, _ = read_all(out)
    assert got["a/w"].tolist() == [[-2.0, 3.0, 3.0]] and got["attn[weight]"].tolist() == [-3.0, 3.0, 3.0]
    r = run("clip", dump, "-o", str(tmp_path / "v2.npz"), "--mode", "value", "--min", "0", "--max", "5")
    got, _ = read_all(str(tmp_path / "v2.npz"))
    assert got["a/w"].tolist() == [[0.0, 3.0, 5.0]]


def test_average_norm_mode(run, dump, tmp_path):
    out = str(tmp_path / "a.npz")
    run("clip", dump, "-o", out, "--mode", "average-norm", "--max", "2")
    got, _ = read_all(out)
    assert np.linalg.norm(got["a/w"].astype(np.float64)) / 3 == pytest.approx(2.0, rel=1e-6)


def test_axes_and_rank_errors(run, tmp_path):
    p = str(tmp_path / "m.npz")
    save_dump(p, {"m": np.array([[3.0, 4.0], [0.0, 1.0]]), "v": np.array([10.0])})
    out = str(tmp_path / "o.npz")
    r = run("clip", p, "-o", out, "--mode", "norm", "--max", "1", "--axes", "1")
    assert r.exit_code == 2 and "'v'" in r.stderr and not os.path.exists(out)
    r = run("clip", p, "-o", out, "--mode", "norm", "--max", "1", "--axes", "-1", "--select", "m")
    assert r.exit_code == 0
    got, _ = read_all(out)
    np.testing.assert_allclose(got["m"], [[0.6, 0.8], [0.0, 1.0]]) and got["v"].tolist() == [10.0]


def test_use_norm_and_norm_type(run, dump, tmp_path):
    r = run("clip", dump, "--dry-run", "--mode", "global-norm", "--max", "1", "--use-norm", "10", "--format", "json")
    assert r.json()["dumps"][0]["scale"] == 0.1
    r = run("clip", dump, "--dry-run", "--mode", "global-norm", "--max", "11", "--norm-type", "1", "--format", "json")
    assert r.json()["dumps"][0]["global_norm_before"] == 33.0 and r.json()["dumps"][0]["scale"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("args", [
    ["--mode", "norm", "--max", "0"],
    ["--mode", "norm", "--max", "-1"],
    ["--mode", "global-norm", "--max", "nan"],
    ["--mode", "global-norm", "--max", "inf"],
    ["--mode", "value", "--min", "2", "--max", "1"],
    ["--mode", "value", "--max", "-1"],
    ["--mode", "norm", "--max", "1", "--use-norm", "3"],
    ["--mode", "value", "--max", "1", "--axes", "0"],
    ["--mode", "norm", "--max", "1", "--norm-type", "1"],
    ["--mode", "norm"],
    ["--mode", "bogus", "--max", "1"],
])
def test_usage_errors_write_nothing(run, dump, tmp_path, args):
    out = str(tmp_path / "never.npz")
    r = run("clip", dump, "-o", out, *args)
    assert r.exit_code == 2, (args, r.stderr)
    assert "Traceback" not in r.stderr and not os.path.exists(out)


def test_nonfinite_policies(run, nan_dump, tmp_path):
    out = str(tmp_path / "x.npz")
    before = sha(nan_dump)
    r = run("clip", nan_dump, "-o", out, "--mode", "global-norm", "--max", "1")
    assert r.exit_code == 1 and "bad" in r.stderr and not os.path.exists(out)
    r = run("clip", nan_dump, "-o", out, "--mode", "norm", "--max", "1")
    assert r.exit_code == 1 and "bad" in r.stderr and not os.path.exists(out)
    r = run("clip", nan_dump, "-o", out, "--mode", "global-norm", "--max", "1", "--nonfinite", "propagate")
    assert r.exit_code == 0
    got, _ = read_all(out)
    assert np.isnan(got["ok"]).all() and np.isnan(got["bad"]).all()  # TensorFlow's behaviour
    out2 = str(tmp_path / "z.npz")
    run("clip", nan_dump, "-o", out2, "--mode", "global-norm", "--max", "100", "--nonfinite", "zero")
    got, _ = read_all(out2)
    assert got["bad"].tolist() == [1.0, 0.0, 0.0] and got["ok"].tolist() == [1.0, 1.0, 1.0]
    assert sha(nan_dump) == before


@pytest.mark.parametrize("mode", ["global-norm", "norm"])
def test_a_norm_beyond_float64_is_not_called_nan_inf(run, tmp_path, mode):
    """A float64 tensor of finite values whose norm overflows float64 is refused under the default
    policy, but named for what it is, apart from a tensor that really holds NaN/Inf."""
    src = str(tmp_path / "huge.npz")
    save_dump(src, {"huge": np.full(1000, 1.7e308), "bad": np.array([1.0, np.nan]), "ok": np.ones(3)})
    out = str(tmp_path / "x.npz")
    r = run("clip", src, "-o", out, "--mode", mode, "--max", "1")
    assert r.exit_code == 1 and not os.path.exists(out), r.stderr
    assert "NaN/Inf in bad;" in r.stderr and "the norm of huge is beyond float64's range" in r.stderr
    assert "NaN/Inf in huge" not in r.stderr and "ok" not in r.stderr.split(":", 2)[2]
    save_dump(src, {"huge": np.full(1000, 1.7e308), "ok": np.ones(3)}, force=True)
    r = run("clip", src, "-o", out, "--mode", mode, "--max", "1")
    assert r.exit_code == 1 and "NaN/Inf" not in r.stderr and "--nonfinite propagate" in r.stderr


def test_a_refused_run_leaves_no_empty_output_directory(run, nan_dump, dump, tmp_path):
    """The output directories a run made are taken back when it fails, unless something is in them;
    a directory that existed before is kept even when empty."""
    sharded = tmp_path / "in" / "step_00000003"
    sharded.mkdir(parents=True)
    save_dump(str(sharded / "rank0.npz"), {"w": np.array([1.0, np.nan])})
    save_dump(str(sharded / "rank1.npz"), {"w": np.array([2.0])})
    out = tmp_path / "new" / "deeper"
    r = run("clip", str(sharded), "-o", str(out), "--mode", "global-norm", "--max", "1")
    assert r.exit_code == 1 and "NaN/Inf in w" in r.stderr
    assert not (tmp_path / "new").exists()
    r = run("clip", dump, nan_dump, "-o", str(out), "--mode", "norm", "--max", "1")  # the first is written
    assert r.exit_code == 1 and sorted(os.listdir(out)) == [os.path.basename(dump)]
    kept = tmp_path / "kept"
    kept.mkdir()
    r = run("clip", nan_dump, dump, "-o", str(kept), "--mode", "norm", "--max", "1")
    assert r.exit_code == 1 and kept.is_dir() and os.listdir(kept) == []


def test_dry_run_with_an_output_writes_nothing(run, dump, nan_dump, tmp_path):
    """--dry-run with -o wrote the clipped dumps (and made the directory) all the same."""
    where = tmp_path / "outputs"
    where.mkdir()
    r = run("clip", dump, "-o", str(where / "o.npz"), "--mode", "norm", "--max", "1", "--dry-run")
    assert r.exit_code == 0 and os.listdir(where) == []
    r = run("clip", dump, nan_dump, "-o", str(where / "d"), "--mode", "norm", "--max", "100",
            "--nonfinite", "zero", "--dry-run")
    assert r.exit_code == 0 and os.listdir(where) == []


def test_never_overwrite_input_and_force(run, dump, tmp_path):
    before = sha(dump)
    r = run("clip", dump, "-o", dump, "--mode", "norm", "--max", "1", "--force")
    assert r.exit_code == 2 and "input" in r.stderr and sha(dump) == before
    out = str(tmp_path / "o.npz")
    assert run("clip", dump, "-o", out, "--mode", "norm", "--max", "1").exit_code == 0
    r = run("clip", dump, "-o", out, "--mode", "norm", "--max", "2")
    assert r.exit_code == 2 and "--force" in r.stderr
    assert run("clip", dump, "-o", out, "--mode", "norm", "--max", "2", "--force").exit_code == 0


def test_dry_run_writes_nothing(run, dump, tmp_path):
    r = run("clip", dump, "--dry-run", "--mode", "norm", "--max", "1", "--format", "json")
    assert r.exit_code == 0 and r.json()["dumps"][0]["output"] is None
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(dump)]
    assert run("clip", dump, "--mode", "norm", "--max", "1").exit_code == 2  # no -o and no --dry-run


def test_stdout_pipe_output_report_on_stderr(run, dump, tmp_path):
    r = run("clip", dump, "-o", "-", "--mode", "value", "--max", "1", "--format", "json")
    assert r.exit_code == 0
    assert json.loads(r.stderr)["dumps"][0]["output"] == "-"

    # a real pipe between two processes: clip writes the dump to stdout, stats reads it from stdin
    import subprocess
    import sys

    clip = subprocess.Popen([sys.executable, "-m", "gradtool", "clip", dump, "-o", "-", "--mode", "value",
                             "--max", "1", "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stats = subprocess.run([sys.executable, "-m", "gradtool", "stats", "-", "--format", "json"], stdin=clip.stdout,
                           capture_output=True, text=True)
    clip.stdout.close()
    assert clip.wait() == 0 and stats.returncode == 0, stats.stderr
    d = json.loads(stats.stdout)["dumps"][0]
    assert max(t["max_abs"] for t in d["tensors"] if t["dtype"].startswith("float")) == 1.0
    assert json.loads(clip.stderr.read())["dumps"][0]["clipped_tensors"] == 2


def test_several_inputs_into_a_directory(run, history, tmp_path):
    outdir = str(tmp_path / "clipped")
    r = run("clip", history, "-o", outdir, "--mode", "global-norm", "--max", "5", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert sorted(os.listdir(outdir)) == sorted(os.listdir(history))
    for d in r.json()["dumps"]:
        assert d["global_norm_after"] <= 5 * (1 + 1e-6)
        assert os.path.dirname(d["output"]) == outdir
    table = run("clip", history, "-o", str(tmp_path / "again"), "--mode", "global-norm", "--max", "5")
    title = table.stdout.splitlines()[0]  # the directory the steps went to, not the first step's file
    assert title.endswith(f"-> {tmp_path / 'again'}{os.sep}"), title


def test_several_inputs_and_an_output_named_as_a_file(run, history, dump, tmp_path):
    """-o clipped.h5 with several inputs made a directory named clipped.h5 (each dump a file in it): now a
    usage error that writes nothing, unless that directory exists (then it is written into)."""
    files = sorted(str(p) for p in (tmp_path / "hist").iterdir())
    for args in ([history], files[:2], [str(tmp_path / "hist")]):
        for name in ("clipped.h5", "clipped.NPZ", "clipped.safetensors"):
            r = run("clip", *args, "-o", str(tmp_path / name), "--mode", "norm", "--max", "1")
            assert r.exit_code == 2 and r.stdout == "", r.stderr
            assert f"-o {tmp_path / 'clipped'}{os.sep}" in r.stderr and r.stderr.count("\n") == 1
            assert not (tmp_path / name).exists()
    r = run("clip", dump, "-o", str(tmp_path / "one.h5"), "--mode", "norm", "--max", "1")  # one input: a file
    assert r.exit_code == 0 and (tmp_path / "one.h5").is_file()
    made = tmp_path / "made.h5"
    made.mkdir()
    r = run("clip", history, "-o", str(made), "--mode", "norm", "--max", "1")
    assert r.exit_code == 0 and sorted(os.listdir(made)) == sorted(os.listdir(history))
    step = tmp_path / "sharded" / "step_00000003"
    step.mkdir(parents=True)
    for rank in (0, 1):
        save_dump(str(step / f"rank{rank}.npz"), {"w": np.full(3, rank + 1.0)})
    r = run("clip", str(step), "--sharded", "-o", str(tmp_path / "shards.npz"), "--mode", "global-norm", "--max", "1")
    assert r.exit_code == 2 and "a sharded step is written into a directory" in r.stderr
    assert not (tmp_path / "shards.npz").exists()
    r = run("clip", str(step), "--sharded", "-o", str(tmp_path / "shards"), "--mode", "global-norm", "--max", "1")
    assert r.exit_code == 0 and sorted(os.listdir(tmp_path / "shards" / "step_00000003")) == ["rank0.npz",
                                                                                           "rank1.npz"]


def test_multistep_h5_roundtrip(run, tmp_path):
    from gradtool import Recorder

    src = str(tmp_path / "run.h5")
    rec = Recorder(src)
    for s in (1, 2, 3):
        rec.write(s, {"layer/w": np.full(4, float(s)), "i": np.arange(2)}, loss=float(s))
    out = str(tmp_path / "clipped.h5")
    r = run("clip", src, "-o", out, "--mode", "global-norm", "--max", "3", "--format", "json")
    assert r.exit_code == 0, r.stderr
    r2 = run("stats", out, "--format", "json")
    d = r2.json()["dumps"]
    assert [x["step"] for x in d] == [1, 2, 3]
    assert [x["global_norm"] for x in d] == pytest.approx([2.0, 3.0, 3.0])
    assert d[2]["metadata"]["loss"] == 3.0


def test_output_format_from_extension(run, dump, tmp_path):
    for ext, fmt in ((".h5", "hdf5"), (".safetensors", "safetensors")):
        out = str(tmp_path / f"o{ext}")
        assert run("clip", dump, "-o", out, "--mode", "norm", "--max", "1").exit_code == 0
        with open_dump(out) as r:
            assert r.format == fmt and r.step == 5 and set(r.names) == {"a/w", "attn[weight]", "count"}


def test_thresholds_file(run, dump, tmp_path):
    th = tmp_path / "th.json"
    th.write_text(json.dumps({"thresholds": {"norm": {"a/w": 1.0}}}))
    out = str(tmp_path / "t.npz")
    r = run("clip", dump, "-o", out, "--mode", "norm", "--thresholds", str(th), "--format", "json")
    assert r.exit_code == 0, r.stderr
    t = {x["name"]: x for x in r.json()["dumps"][0]["tensors"]}
    assert t["a/w"]["clipped"] and t["a/w"]["norm_after"] == pytest.approx(1.0, rel=1e-6)
    assert not t["attn[weight]"]["clipped"]
    th.write_text(json.dumps({"thresholds": {"a/w": 2.0}}))  # the bare form the README allows
    r = run("clip", dump, "--dry-run", "--mode", "norm", "--thresholds", str(th), "--format", "json")
    t = {x["name"]: x for x in r.json()["dumps"][0]["tensors"]}
    assert t["a/w"]["threshold"] == 2.0 and t["a/w"]["norm_after"] == pytest.approx(2.0, rel=1e-6)


def test_report_formats(run, dump):
    r = run("clip", dump, "--dry-run", "--mode", "norm", "--max", "1", "--format", "csv")
    assert r.stdout.splitlines()[0].startswith("input,group,step,output,name,norm_before")
    r = run("clip", dump, "--dry-run", "--mode", "norm", "--max", "1")
    assert "attn[weight]" in r.stdout and "global norm" in r.stdout


@pytest.mark.parametrize("flag", [[], ["--no-fsync"]])
def test_no_fsync_skips_only_the_flush(run, dump, tmp_path, monkeypatch, flag):
    """By default the output is flushed to disk before the rename; --no-fsync skips every flush (as cp)
    and writes the same bytes, still through a temporary file renamed into place."""
    import gradtool.io.atomic as atomic

    flushes = []

    def ours(fd):  # os is patched process-wide: count only flushes of files in this test's directory
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))
        except OSError:
            return True

    monkeypatch.setattr(atomic.os, "fsync", lambda fd: ours(fd) and flushes.append("fsync"))
    monkeypatch.setattr(atomic.os, "fdatasync", lambda fd: ours(fd) and flushes.append("fdatasync"))
    out = str(tmp_path / "out.npz")
    r = run("clip", dump, "-o", out, "--mode", "global-norm", "--max", "1", *flag)
    assert r.exit_code == 0, r.stderr
    assert ("fsync" in flushes) == (not flag) and (not flushes) == bool(flag)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".gradtool-tmp")]  # no temporary file left
    ref = str(tmp_path / "ref" / "out.npz")
    os.makedirs(os.path.dirname(ref))
    assert run("clip", dump, "-o", ref, "--mode", "global-norm", "--max", "1").exit_code == 0
    assert sha(out) == sha(ref)


@pytest.mark.parametrize("name, metadata, step", [("step_500.npz", None, 500), ("grads.npz", None, 0),
                                                  ("step_500.npz", {"step": 7}, 7)])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_lone_dumps_step_is_its_metadatas_else_its_names(run, tmp_path, name, metadata, step, dry_run):
    """Taken when the dump is opened to be clipped (not by an open beforehand): the same steps."""
    src = str(tmp_path / name)
    save_dump(src, {"w": np.full(4, 3.0, np.float32)}, metadata=metadata)
    out = ["--dry-run"] if dry_run else ["-o", str(tmp_path / "out.npz")]
    r = run("clip", src, *out, "--mode", "global-norm", "--max", "1", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["dumps"][0]["step"] == step


@pytest.mark.parametrize("ext, module, cls", [("safetensors", "safetensors", "SafetensorsReader"),
                                               ("npz", "npz", "NpzReader")])
def test_one_dump_is_opened_once(run, tmp_path, monkeypatch, ext, module, cls):
    """Each open of a 20,000-tensor dump indexes it again (~0.15-0.5 s): clip opened it to count its
    tensors for a progress bar that stderr, not a terminal, never shows; to learn its step; and (npz) to
    see whether it is compressed. Now once, to clip it, with the step its metadata gives."""
    import importlib

    mod = importlib.import_module(f"gradtool.io.{module}")
    src = str(tmp_path / f"g.{ext}")
    save_dump(src, {"w": np.ones((3, 4), np.float32), "b": np.ones(4, np.float32)}, metadata={"step": 70})
    opened = []
    real = getattr(mod, cls).__init__
    monkeypatch.setattr(getattr(mod, cls), "__init__", lambda self, *a, **k: opened.append(a[0]) or real(self, *a, **k))
    r = run("clip", src, "-o", str(tmp_path / f"out.{ext}"), "--mode", "global-norm", "--max", "1",
            "--format", "json")
    assert r.exit_code == 0 and len(opened) == 1, (r.stderr, opened)
    assert json.loads(r.stdout)["dumps"][0]["step"] == 70
