"""Scalars saved beside the gradients (``np.savez(path, **grads, step=step, loss=loss, lr=lr)``) are the dump's
metadata: as tensors the loss entered the global norm as a gradient would, and ``clip`` scaled it."""

import json
import math

import h5py
import numpy as np
import pytest
from safetensors.numpy import save_file

from gradtool import open_dump
from gradtool.io.base import METADATA_SCALARS

GRADS = {"w": np.array([[3.0, -4.0], [1.0, 2.0]], np.float32), "b": np.array([0.5, -1.5], np.float32)}
SCALARS = {"step": np.int64(100), "loss": np.float64(7.5), "lr": np.float32(1e-3)}


def _grads_norm() -> float:
    """float64 reference: the global norm of the gradients alone."""
    return math.sqrt(sum(float(x) ** 2 for g in GRADS.values() for x in g.astype(np.float64).ravel()))


def _write(fmt: str, path: str, members: dict) -> str:
    if fmt == "npz":
        np.savez(path, **members)
    elif fmt == "safetensors":
        save_file({k: np.asarray(v) for k, v in members.items()}, path)
    else:
        with h5py.File(path, "w") as f:
            for k, v in members.items():
                f[k] = v
    return path


@pytest.mark.parametrize("fmt", ["npz", "safetensors", "h5"])
def test_scalars_named_as_metadata_are_metadata_not_tensors(tmp_path, run, fmt):
    p = _write(fmt, str(tmp_path / f"dump.{fmt}"), {**GRADS, **SCALARS})
    with open_dump(p) as r:
        assert sorted(r.names) == ["b", "w"]
        assert r.step == 100 and type(r.metadata["step"]) is int
        assert r.metadata["loss"] == 7.5 and r.metadata["lr"] == pytest.approx(1e-3, rel=1e-7)
    out = run("stats", p, "--format", "json")
    assert out.exit_code == 0, out.stderr
    record = json.loads(out.stdout)["dumps"][0]
    assert record["global_norm"] == pytest.approx(_grads_norm(), rel=1e-12)  # was sqrt(norm^2 + 7.5^2 + ...)
    assert record["num_tensors"] == 2 and record["step"] == 100
    table = run("stats", p)
    assert f"(step 100, {'hdf5' if fmt == 'h5' else fmt}, loss 7.5, lr 0.001)" in table.stdout


def test_clip_leaves_the_loss_alone_and_keeps_it_as_metadata(tmp_path, run):
    p = _write("npz", str(tmp_path / "dump.npz"), {**GRADS, **SCALARS})
    out = str(tmp_path / "clipped.npz")
    r = run("clip", p, "-o", out, "--mode", "global-norm", "--max", "1", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert {t["name"] for t in json.loads(r.stdout)["dumps"][0]["tensors"]} == {"w", "b"}
    with open_dump(out) as c:
        assert sorted(c.names) == ["b", "w"] and c.metadata["loss"] == 7.5 and c.step == 100
        scale = 1 / _grads_norm()
        np.testing.assert_allclose(c.read("w"), GRADS["w"].astype(np.float64) * scale, rtol=1e-6)


def _members(path: str) -> dict:
    """The top-level members of a file as {name: array}, read with the format's own library."""
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    if path.endswith(".safetensors"):
        from safetensors.numpy import load_file

        return load_file(path)
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f if isinstance(f[k], h5py.Dataset)}


@pytest.mark.parametrize("fmt_in", ["npz", "safetensors", "h5"])
@pytest.mark.parametrize("fmt_out", ["npz", "safetensors", "h5"])
def test_clip_writes_the_scalars_back_as_they_were(tmp_path, run, fmt_in, fmt_out):
    """The clipped copy holds step, loss and lr as members of their dtype and value, as the input did (the
    training loop that reads ``z["loss"]`` back finds it), and not a second time as gradtool's metadata
    (which would make them tensors when read: a name the metadata gives stays a tensor)."""
    p = _write(fmt_in, str(tmp_path / f"dump.{fmt_in}"), {**GRADS, **SCALARS})
    out = str(tmp_path / f"clipped.{fmt_out}")
    r = run("clip", p, "-o", out, "--mode", "global-norm", "--max", "1")
    assert r.exit_code == 0, r.stderr
    members = _members(out)
    assert sorted(members) == sorted([*GRADS, *SCALARS])
    for name, value in SCALARS.items():
        assert members[name].shape == () and members[name].dtype == np.asarray(value).dtype
        assert members[name] == value
    with open_dump(out) as c:  # and it reads as the input did
        assert sorted(c.names) == ["b", "w"]
        assert (c.step, c.metadata["loss"]) == (100, 7.5)
        assert c.metadata["lr"] == pytest.approx(1e-3, rel=1e-7)
    again = run("stats", out, "--format", "json")
    assert json.loads(again.stdout)["dumps"][0]["global_norm"] == pytest.approx(1.0, rel=1e-6)


def test_clip_of_an_hdf5_history_keeps_each_steps_scalars(tmp_path, run):
    p = str(tmp_path / "history.h5")
    with h5py.File(p, "w") as f:
        for step in (1, 2):
            g = f.create_group(f"step_{step}")
            g.attrs["step"] = step
            for k, v in GRADS.items():
                g[k] = v * step
            g["loss"] = np.float64(step / 4)
    out = str(tmp_path / "clipped.h5")
    r = run("clip", p, "-o", out, "--mode", "global-norm", "--max", "1")
    assert r.exit_code == 0, r.stderr
    with h5py.File(out, "r") as f:
        assert [float(f[f"step_{s}/loss"][()]) for s in (1, 2)] == [0.25, 0.5]
        assert "loss" not in f["step_1"].attrs
    records = json.loads(run("stats", out, "--format", "json").stdout)["dumps"]
    assert [d["metadata"]["loss"] for d in records] == [0.25, 0.5]
    assert [d["num_tensors"] for d in records] == [2, 2]


def test_what_stays_a_tensor(tmp_path):
    """Only top-level 0-d numbers under the metadata names move: a one-element array, a nested name, a
    bool, a name the metadata gives already, and other scalars (a learnable temperature's gradient)
    stay tensors."""
    p = str(tmp_path / "dump.h5")
    with h5py.File(p, "w") as f:
        f["loss"] = np.array([7.5])  # shape (1,)
        f["layer/lr"] = 0.1  # not top-level
        f["step"] = True  # a bool
        f["logit_scale"] = 2.0  # a scalar parameter's gradient
        f["lr"] = 0.5
        f.attrs["lr"] = 0.25  # the metadata names the lr already
    with open_dump(p) as r:
        assert r.names == ["layer/lr", "logit_scale", "loss", "lr", "step"]
        assert r.metadata == {"lr": 0.25}


def test_every_metadata_name_moves(tmp_path):
    members = {**GRADS, **{name: np.float32(i + 0.5) for i, name in enumerate(sorted(METADATA_SCALARS))}}
    p = _write("npz", str(tmp_path / "dump.npz"), members)
    with open_dump(p) as r:
        assert sorted(r.names) == ["b", "w"]
        assert r.metadata == {name: i + 0.5 for i, name in enumerate(sorted(METADATA_SCALARS))}


def test_a_nan_loss_is_metadata_too(tmp_path, run):
    p = _write("npz", str(tmp_path / "dump.npz"), {**GRADS, "loss": np.float32("nan")})
    with open_dump(p) as r:
        assert math.isnan(r.metadata["loss"]) and sorted(r.names) == ["b", "w"]
    out = run("stats", p, "--fail-on-nonfinite")
    assert out.exit_code == 0, out.stderr  # the gradients are finite: a NaN loss is not a NaN gradient


def test_selecting_a_metadata_scalar_says_where_it_went(tmp_path, run):
    """``--select loss`` on such a dump selected the loss as a tensor before; now it is metadata, and the
    usage error says so instead of only listing the tensor names."""
    p = _write("npz", str(tmp_path / "dump.npz"), {**GRADS, **SCALARS})
    r = run("stats", p, "--select", "loss")
    assert r.exit_code == 2
    assert "(a scalar named 'loss' is the dump's metadata, not a tensor)" in r.stderr
    assert "is the dump's metadata" not in run("stats", p, "--select", "zz").stderr
