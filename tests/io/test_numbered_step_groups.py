"""An HDF5 history written by hand as one group per step named by the bare step number
(``f.create_group(str(step))``) was read as one dump without a word: "step 0", one global norm over every
step, exit 0, and ``suggest-threshold`` saw one observation. Bare numbers stay no steps by default
(``nn.Sequential`` names its layers ``0``, ``1``, ...), but such a file whose groups hold the same tensors
is warned about, and ``--numbered-groups-are-steps`` reads each group as its step."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from gradtool import iter_dumps
from gradtool.io.base import numbered_names
from tests.reference import ref_global

RNG = np.random.default_rng(11)
STEPS = {100: 1.0, 200: 40.0, 300: 2.0}  # step -> scale of its gradients
FLAG = "--numbered-groups-are-steps"


def _grads(scale: float) -> dict[str, np.ndarray]:
    return {"enc/w": (RNG.standard_normal((8, 6)) * scale).astype(np.float32),
            "b": (RNG.standard_normal(6) * scale).astype(np.float32)}



@pytest.fixture
def numbered(tmp_path):
    p = tmp_path / "grads.h5"
    written = {}
    with h5py.File(p, "w") as f:
        for step, scale in STEPS.items():
            written[step] = _grads(scale)
            g = f.create_group(str(step))
            for name, value in written[step].items():
                g[name] = value
    return str(p), written


def test_read_as_one_dump_by_default_with_a_warning_naming_the_flag(run, numbered):
    p, written = numbered
    r = run("stats", p, "--format", "json")
    assert r.exit_code == 0, r.stderr
    dumps = json.loads(r.stdout)["dumps"]
    assert len(dumps) == 1 and dumps[0]["num_tensors"] == 6
    every = [a for grads in written.values() for a in grads.values()]
    assert dumps[0]["global_norm"] == pytest.approx(ref_global(every), rel=1e-6)
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, r.stderr
    assert "grads.h5" in warnings[0] and "3 top-level groups" in warnings[0] and FLAG in warnings[0]
    assert "2 tensor(s)" in warnings[0]


def test_stats_with_the_flag_reads_each_group_as_its_step(run, numbered):
    p, written = numbered
    r = run("stats", p, FLAG, "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert "warning" not in r.stderr
    dumps = json.loads(r.stdout)["dumps"]
    assert [(d["step"], d["group"]) for d in dumps] == [(s, str(s)) for s in STEPS]
    for d in dumps:
        assert d["global_norm"] == pytest.approx(ref_global(written[d["step"]].values()), rel=1e-6)
        assert sorted(t["name"] for t in d["tensors"]) == ["b", "enc/w"]


def test_clip_with_the_flag_scales_each_step_by_its_own_norm(run, numbered, tmp_path):
    p, written = numbered
    out = str(tmp_path / "clipped.h5")
    r = run("clip", p, FLAG, "-o", out, "--mode", "global-norm", "--max", "5", "--format", "json")
    assert r.exit_code == 0, r.stderr
    reports = json.loads(r.stdout)["dumps"]
    assert [rep["step"] for rep in reports] == list(STEPS)
    for rep in reports:
        scale = min(1.0, 5 / ref_global(written[rep["step"]].values()))
        assert rep["scale"] == pytest.approx(scale, rel=1e-6)
    with h5py.File(out, "r") as f:  # the layout kept: groups named by number, no attribute added
        assert sorted(f, key=int) == [str(s) for s in STEPS] and "step" not in f["100"].attrs
        for step, grads in written.items():
            scale = min(1.0, 5 / ref_global(grads.values()))
            for name, value in grads.items():
                np.testing.assert_allclose(f[f"{step}/{name}"][()], value.astype(np.float64) * scale,
                                           rtol=1e-6)
    again = json.loads(run("stats", out, FLAG, "--format", "json").stdout)["dumps"]
    assert [d["step"] for d in again] == list(STEPS)
    assert max(d["global_norm"] for d in again) == pytest.approx(5.0, rel=1e-6)


def test_suggest_threshold_sees_the_steps_only_with_the_flag(run, numbered):
    p, _ = numbered
    without = run("suggest-threshold", p, "--format", "json")
    assert json.loads(without.stdout)["history"]["n"] == 1 and FLAG in without.stderr
    r = run("suggest-threshold", p, FLAG, "--format", "json")
    assert r.exit_code in (0, 4), r.stderr  # 4: three steps are too few for a threshold
    h = json.loads(r.stdout)["history"]
    assert (h["n"], h["first_step"], h["last_step"]) == (3, 100, 300)


def test_the_library_takes_the_flag_too(numbered):
    p, _ = numbered
    seen = {ref.step: reader.names for ref, reader in iter_dumps([p], numbered_groups_are_steps=True)}
    assert seen == {s: ["b", "enc/w"] for s in STEPS}
    assert [ref.group for ref, _ in iter_dumps([p])] == [None]


def _write(path, layout: dict[str, tuple[int, ...]]) -> str:
    with h5py.File(path, "w") as f:
        for name, shape in layout.items():
            f[name] = np.ones(shape, np.float32)
    return str(path)


@pytest.mark.parametrize("layout", [
    {"0/weight": (4, 3), "0/bias": (4,), "2/weight": (2, 4), "2/bias": (2,)},  # nn.Sequential's layers
    {"0/weight": (4, 4), "1/weight": (4, 4), "1/bias": (4,)},  # not the same tensors
    {"0/weight": (4, 4), "1/weight": (4, 4), "loose": (3,)},  # a dataset at the top
    {"7/weight": (4, 4)},  # one group
    {"0/a/w": (3,), "1/a": (3,)},  # a group in one, a dataset of that name in the other
])
def test_no_warning_where_the_groups_differ(run, tmp_path, layout):
    p = _write(tmp_path / "one.h5", layout)
    r = run("stats", p, "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert "warning" not in r.stderr
    assert json.loads(r.stdout)["dumps"][0]["num_tensors"] == len(layout)


def test_the_shapes_and_dtypes_are_compared_not_only_the_names(run, tmp_path):
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["1/w"] = np.ones(3, np.float32)
        f["2/w"] = np.ones(3, np.float64)
    assert "warning" not in run("stats", str(tmp_path / "d.h5")).stderr
    same = _write(tmp_path / "s.h5", {"1/w": (3,), "2/w": (3,)})
    assert FLAG in run("stats", same).stderr


def test_step_attributes_still_win_over_the_flag(run, tmp_path):
    p = str(tmp_path / "rec.h5")
    with h5py.File(p, "w") as f:
        for name, step in (("1", 10), ("2", 20)):
            f.create_group(name).attrs["step"] = step
            f[f"{name}/w"] = np.ones(3, np.float32)
    for args in ((), (FLAG,)):
        dumps = json.loads(run("stats", p, *args, "--format", "json").stdout)["dumps"]
        assert [d["step"] for d in dumps] == [10, 20]


def test_numbered_names():
    assert numbered_names(["100", "200", "0"]) == [100, 200, 0]
    assert numbered_names(["1", "01"]) is None  # one step twice
    assert numbered_names(["step_1", "2"]) is None and numbered_names([]) is None
    assert numbered_names(["\u0661", "2"]) is None  # an Arabic-Indic one: no ASCII digit
    assert numbered_names(["-1", "2"]) is None and numbered_names(["1.5"]) is None
