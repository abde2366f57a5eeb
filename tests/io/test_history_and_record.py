import numpy as np
import pytest

from gradtool import Recorder, open_dump, record, save_dump
from gradtool.io.history import expand_inputs, step_from_filename


def test_step_from_metadata_then_filename_then_order(tmp_path):
    save_dump(str(tmp_path / "step_00100.npz"), {"w": np.ones(1)})
    save_dump(str(tmp_path / "named_7.npz"), {"w": np.ones(1)}, {"step": 3})
    save_dump(str(tmp_path / "nonumber.npz"), {"w": np.ones(1)})
    refs = expand_inputs([str(tmp_path / "step_00100.npz"), str(tmp_path / "named_7.npz"), str(tmp_path / "nonumber.npz")])
    assert [r.step for r in refs] == [100, 3, 2]


def test_directory_expansion_ignores_non_dumps(tmp_path):
    save_dump(str(tmp_path / "b_2.npz"), {"w": np.ones(1)})
    save_dump(str(tmp_path / "a_1.safetensors"), {"w": np.ones(1)})
    (tmp_path / "notes.txt").write_text("hi")
    refs = expand_inputs([str(tmp_path)])
    assert [r.step for r in refs] == [1, 2]


def test_step_from_filename():
    assert step_from_filename("/runs/7/step_00100.npz") == 100
    assert step_from_filename("final.npz") is None


def test_recorder_h5_history_and_torch_like_tensors(tmp_path):
    class FakeTorch:  # has __dlpack__ / __array__, like torch, jax, tf tensors
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None, copy=None):
            return self.a

    rec = Recorder(str(tmp_path / "run.h5"))
    for s in (0, 10, 20):
        rec.write(s, {"layer/w": FakeTorch(np.full((2, 2), s, np.float32)), "b": np.arange(2.0)}, loss=1.0 / (s + 1), lr=np.float64(0.1))
    refs = expand_inputs([str(tmp_path / "run.h5")])
    assert [r.step for r in refs] == [0, 10, 20]
    with refs[1].open() as r:
        assert r.names == ["layer/w", "b"] and r.metadata["loss"] == pytest.approx(1 / 11)
        assert r.read("layer/w")[0, 0] == 10
    with pytest.raises(Exception, match="already recorded"):
        rec.write(10, {"w": np.ones(1)})


def test_recorder_directory_formats(tmp_path):
    for fmt in ("npz", "safetensors", "hdf5"):
        rec = Recorder(str(tmp_path / fmt), format=fmt)
        path = rec.write(5, {"w": np.ones(3)}, loss=2.0)
        with open_dump(path) as r:
            assert r.step == 5 and r.metadata["loss"] == 2.0
    p = record(str(tmp_path / "one"), 1, {"w": np.ones(1)})
    assert p.endswith("step_00000001.npz")


def test_dlpack_only_tensor(tmp_path):
    class DL:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    p = record(str(tmp_path), 2, {"w": DL(np.arange(3.0))})
    with open_dump(p) as r:
        assert r.read("w").tolist() == [0, 1, 2]
