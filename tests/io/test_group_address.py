"""``FILE::GROUP`` reads one group of an HDF5 file as a dump: the label gradtool's own messages give a
step of a history file (``--fail-on-nonfinite``'s "step 5 (run.h5::step_5)", ``--skip-unreadable``'s
"skipped run.h5::step_5"), which gave "no such file or directory" when a user passed it back."""

from __future__ import annotations

import json
import os
import re

import h5py
import numpy as np
import pytest

from tests.reference import ref_global

RNG = np.random.default_rng(5)



@pytest.fixture
def history(tmp_path):
    """A Recorder-style history: groups step_1..step_4 with a ``step`` attribute; step 3 holds a NaN."""
    p = str(tmp_path / "run.h5")
    written = {}
    with h5py.File(p, "w") as f:
        for step in range(1, 5):
            g = f.create_group(f"step_{step}")
            g.attrs["step"] = step
            written[step] = {"enc/w": (RNG.standard_normal((6, 5)) * step).astype(np.float32),
                             "b": RNG.standard_normal(5).astype(np.float32)}
            if step == 3:
                written[step]["b"][2] = np.nan
            for name, value in written[step].items():
                g[name] = value
    return p, written


def test_stats_of_one_step_group(run, history):
    p, written = history
    for address in (f"{p}::step_2", f"{p}::/step_2/"):
        r = run("stats", address, "--format", "json")
        assert r.exit_code == 0, r.stderr
        [d] = json.loads(r.stdout)["dumps"]
        assert (d["path"], d["group"], d["step"]) == (p, "step_2", 2)
        assert d["global_norm"] == pytest.approx(ref_global(written[2].values()), rel=1e-6)
        assert sorted(t["name"] for t in d["tensors"]) == ["b", "enc/w"]


def test_the_label_of_a_message_can_be_passed_back(run, history):
    p, _ = history
    r = run("stats", p, "--fail-on-nonfinite")
    assert r.exit_code == 3
    label = re.search(r"step 3 \((\S+)\)", r.stderr).group(1)
    assert label == f"{p}::step_3"
    again = run("stats", label, "--format", "json")
    assert again.exit_code == 0, again.stderr
    [d] = json.loads(again.stdout)["dumps"]
    assert d["step"] == 3 and d["nonfinite_tensors"] == ["b"]


def test_several_groups_form_a_history(run, history):
    p, written = history
    r = run("stats", f"{p}::step_4", f"{p}::step_1", "--format", "json")
    assert r.exit_code == 0, r.stderr
    dumps = json.loads(r.stdout)["dumps"]
    assert [d["step"] for d in dumps] == [1, 4]  # in step order
    expected = [ref_global(written[s].values()) for s in (1, 4)]
    assert [d["global_norm"] for d in dumps] == pytest.approx(expected, rel=1e-6)
    doc = json.loads(run("suggest-threshold", f"{p}::step_1", f"{p}::step_2", "--format", "json").stdout)
    assert doc["history"]["n"] == 2 and doc["source"]["kind"] == "dumps"


def test_clip_writes_that_group_only_and_leaves_the_input(run, history, tmp_path):
    p, written = history
    with open(p, "rb") as f:
        before = f.read()
    out = str(tmp_path / "one.h5")
    r = run("clip", f"{p}::step_4", "--mode", "global-norm", "--max", "1", "-o", out, "--format", "json")
    assert r.exit_code == 0, r.stderr
    [rep] = json.loads(r.stdout)["dumps"]
    assert rep["step"] == 4 and rep["scale"] == pytest.approx(1 / ref_global(written[4].values()), rel=1e-6)
    with h5py.File(out, "r") as f:
        assert list(f) == ["step_4"] and f["step_4"].attrs["step"] == 4
        np.testing.assert_allclose(f["step_4/enc/w"][()], written[4]["enc/w"] * rep["scale"], rtol=1e-6)
    with open(p, "rb") as f:
        assert f.read() == before


def test_a_group_named_by_step_without_the_attribute(run, tmp_path):
    p = str(tmp_path / "h.h5")
    with h5py.File(p, "w") as f:
        f["step_70/w"] = np.ones(4, np.float32)
        f["300/w"] = np.ones(4, np.float32)
    cases = ((f"{p}::step_70", ()), (f"{p}::300", ()), (f"{p}::300", ("--numbered-groups-are-steps",)))
    steps = [json.loads(run("stats", a, *flag, "--format", "json").stdout)["dumps"][0]["step"]
             for a, flag in cases]
    assert steps == [70, 0, 300]  # a bare number is a step with the flag only (else: its position)


def test_bad_addresses_are_one_line_errors(run, history, tmp_path):
    p, _ = history
    with h5py.File(p, "a") as f:
        f["soft"] = h5py.SoftLink("/step_1")
        f["ext"] = h5py.ExternalLink("other.h5", "/x")
    npz = str(tmp_path / "g.npz")
    np.savez(npz, w=np.ones(3, np.float32))
    cases = {
        f"{p}::nope": "no group 'nope'",
        f"{p}::step_1/nope": "no group 'step_1/nope'",
        f"{p}::step_1/b": "'step_1/b' is not a group",
        f"{p}::soft": "'soft' is a soft link",
        f"{p}::ext": "other.h5",
        f"{p}::": "without a group",
        f"{p}::..": "no group '..'",
        f"{npz}::w": "is not an HDF5 file",
        str(tmp_path / "missing.h5::step_1"): "no such file or directory",
    }
    for address, message in cases.items():
        r = run("stats", address)
        assert r.exit_code == 1, (address, r.stdout)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gradtool: error: ") and message in lines[0], lines
        assert "Traceback" not in r.stderr
    assert os.path.exists(p)


def test_a_file_whose_name_holds_two_colons_is_still_a_file(run, tmp_path):
    p = str(tmp_path / "a::b.h5")
    with h5py.File(p, "w") as f:
        f["w"] = np.full(4, 2, np.float32)
    r = run("stats", p, "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["dumps"][0]["global_norm"] == pytest.approx(4.0)
