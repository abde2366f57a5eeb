"""``--skip-unreadable``: a history read while the training job still writes its last dump (or with one
damaged file) leaves the unreadable dumps out, names each on stderr and in the JSON, and reads the rest;
without the flag the first unreadable dump stops the command, as before."""

from __future__ import annotations

import json
import math
import shutil

import h5py
import numpy as np
import pytest
from safetensors.numpy import save_file

from gradtool import open_dump, save_dump

RNG = np.random.default_rng(7)


def _grads(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"w": (RNG.standard_normal((40, 30)) * scale).astype(np.float32),
            "b": (RNG.standard_normal(30) * scale).astype(np.float32)}


def _norm(grads: dict[str, np.ndarray]) -> float:
    """float64 reference of the global L2 norm."""
    return math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))


def _cut(path, keep: float = 0.5) -> None:
    """Keep the first ``keep`` of the file's bytes: a dump still being written, or a crash mid-save."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _damage_inside(path) -> None:
    """Flip bytes inside the first member's compressed data (the zip directory whole): the dump opens
    and fails when that tensor is read (CRC-32 mismatch)."""
    data = bytearray(path.read_bytes())
    for i in range(1500, 1700):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with open_dump(str(path)) as r:  # the premise: it opens
        assert r.names == ["w", "b"]


@pytest.fixture
def run_dir(tmp_path):
    """step_1..step_4 whole (npz, safetensors, HDF5, npz), step_5.npz and step_6.safetensors cut short."""
    d = tmp_path / "run"
    d.mkdir()
    norms = {}
    for step, ext in ((1, "npz"), (2, "safetensors"), (3, "h5"), (4, "npz"), (5, "npz"), (6, "safetensors")):
        g = _grads(step)
        norms[step] = _norm(g)
        p = d / f"step_{step}.{ext}"
        if ext == "safetensors":
            save_file(g, str(p))
        elif ext == "h5":
            with h5py.File(p, "w") as f:
                for k, v in g.items():
                    f[k] = v
        else:
            np.savez(p, **g)
    _cut(d / "step_5.npz")
    _cut(d / "step_6.safetensors", 0.9)
    return d, norms


def test_without_the_flag_the_first_unreadable_dump_stops_stats(run, run_dir):
    d, _ = run_dir
    r = run("stats", str(d))
    assert r.exit_code == 1
    assert "step_5.npz: truncated .npz archive" in r.stderr and r.stdout == ""


def test_stats_reads_the_rest_and_names_what_it_left_out(run, run_dir):
    d, norms = run_dir
    r = run("stats", str(d), "--skip-unreadable", "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["step"] for x in doc["dumps"]] == [1, 2, 3, 4]
    for x in doc["dumps"]:
        assert x["global_norm"] == pytest.approx(norms[x["step"]], rel=1e-6)
    assert [s["dump"] for s in doc["skipped"]] == [str(d / "step_5.npz"), str(d / "step_6.safetensors")]
    assert doc["skipped"][0]["error"].startswith("truncated .npz archive: the zip directory")
    assert "run past the end of the file" in doc["skipped"][1]["error"]
    warnings = [line for line in r.stderr.splitlines() if line.startswith("gradtool: warning: skipped ")]
    assert len(warnings) == 2 and str(d / "step_5.npz") + ": truncated" in warnings[0]
    table = run("stats", str(d), "--skip-unreadable")
    assert table.exit_code == 0 and "4 steps" in table.stdout
    assert json.loads(run("stats", str(d / "step_1.npz"), "--format", "json").stdout)["skipped"] == []


def test_stats_explicit_files_and_nothing_readable(run, run_dir):
    d, _ = run_dir
    r = run("stats", str(d / "step_4.npz"), str(d / "step_5.npz"), "--skip-unreadable", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert [x["step"] for x in json.loads(r.stdout)["dumps"]] == [4]
    none = run("stats", str(d / "step_5.npz"), str(d / "step_6.safetensors"), "--skip-unreadable")
    assert none.exit_code == 1
    assert "no readable dump (all 2 skipped)" in none.stderr and none.stdout == ""
    assert run("stats", str(d / "missing.npz"), "--skip-unreadable").exit_code == 1  # a typo is no skip


def test_a_dump_that_opens_but_cannot_be_read_is_left_out_too(run, tmp_path):
    """A compressed member damaged inside (its zip directory whole): the dump opens and fails when read."""
    d = tmp_path / "run"
    d.mkdir()
    good = _grads()
    np.savez_compressed(d / "step_1.npz", **good)
    np.savez_compressed(d / "step_2.npz", **_grads())
    _damage_inside(d / "step_2.npz")
    assert run("stats", str(d)).exit_code == 1
    r = run("stats", str(d), "--skip-unreadable", "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["step"] for x in doc["dumps"]] == [1]
    assert doc["dumps"][0]["global_norm"] == pytest.approx(_norm(good), rel=1e-6)
    assert [s["dump"] for s in doc["skipped"]] == [str(d / "step_2.npz")]


def test_suggest_threshold_gives_what_the_readable_dumps_give(run, tmp_path):
    whole = tmp_path / "whole"
    whole.mkdir()
    for step in range(1, 61):
        save_dump(str(whole / f"step_{step:03d}.npz"), _grads(1.0 + 0.05 * math.sin(step)), {"step": step})
    live = tmp_path / "live"
    shutil.copytree(whole, live)
    np.savez(live / "step_061.npz", **_grads())
    _cut(live / "step_061.npz")
    assert run("suggest-threshold", str(live)).exit_code == 1
    want = json.loads(run("suggest-threshold", str(whole), "--format", "json").stdout)
    r = run("suggest-threshold", str(live), "--skip-unreadable", "--format", "json")
    assert r.exit_code == 0, r.stderr
    got = json.loads(r.stdout)
    assert [m["threshold"] for m in got["modes"]] == [m["threshold"] for m in want["modes"]]
    assert [s["dump"] for s in got["skipped"]] == [str(live / "step_061.npz")]
    assert got["history"]["warnings"][0] == (f"1 unreadable dump(s) left out (--skip-unreadable): "
                                             f"{live / 'step_061.npz'}")
    assert want["skipped"] == []


def test_clip_writes_the_readable_dumps_only(run, run_dir, tmp_path):
    d, norms = run_dir
    out = tmp_path / "clipped"
    r = run("clip", str(d), "-o", str(out), "--mode", "global-norm", "--max", "1", "--skip-unreadable",
            "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert sorted(p.name for p in out.iterdir()) == ["step_1.npz", "step_2.safetensors", "step_3.h5", "step_4.npz"]
    assert [x["global_norm_before"] for x in doc["dumps"]] == pytest.approx([norms[s] for s in (1, 2, 3, 4)],
                                                                            rel=1e-6)
    assert len(doc["skipped"]) == 2
    again = tmp_path / "again"
    assert run("clip", str(d), "-o", str(again), "--mode", "global-norm", "--max", "1").exit_code == 1
    assert not again.exists()  # without the flag: nothing written, the directory it made taken back


def test_dask_engine_leaves_out_what_its_workers_cannot_read(run, tmp_path):
    pytest.importorskip("distributed")
    d = tmp_path / "run"
    d.mkdir()
    good = {s: _grads(s) for s in (1, 2)}
    for s, g in good.items():
        save_dump(str(d / f"step_{s}.npz"), g, {"step": s})
    np.savez_compressed(d / "step_3.npz", **_grads())
    _damage_inside(d / "step_3.npz")
    r = run("stats", str(d), "--skip-unreadable", "--engine", "dask", "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["global_norm"] for x in doc["dumps"]] == pytest.approx([_norm(good[1]), _norm(good[2])], rel=1e-6)
    assert [s["dump"] for s in doc["skipped"]] == [str(d / "step_3.npz")]
