
import numpy as np
import pytest

from gradtool import save_dump


@pytest.fixture
def dump(tmp_path):
    p = str(tmp_path / "step_00005.npz")
    save_dump(p, {"a/w": np.array([[-2.0, 3.0, 6.0]], np.float32), "attn[weight]": np.array([-4.0, 6.0, 12.0]),
                  "count": np.arange(3)}, {"step": 5, "loss": 1.25})
    return p


@pytest.fixture
def history(tmp_path):
    d = tmp_path / "hist"
    d.mkdir()
    rng = np.random.default_rng(0)
    for s in range(6):
        scale = 100.0 if s == 3 else 1.0
        save_dump(str(d / f"step_{s:03d}.npz"), {"w": (rng.standard_normal(50) * scale).astype(np.float32),
                                                 "b": rng.standard_normal(5)})
    return str(d)


@pytest.fixture
def nan_dump(tmp_path):
    p = str(tmp_path / "nan_7.npz")
    save_dump(p, {"ok": np.ones(3), "bad": np.array([1.0, np.nan, np.inf])}, {"step": 7})
    return p
