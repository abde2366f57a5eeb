import os

import numpy as np
import pytest

from gradtool import save_dump
from gradtool.errors import OutputError
from gradtool.io.atomic import atomic_output
from gradtool.io import npz as npzmod


def test_failure_mid_write_leaves_target_untouched(tmp_path, monkeypatch):
    p = str(tmp_path / "out.npz")
    save_dump(p, {"w": np.ones(3)})
    before = open(p, "rb").read()
    calls = {"n": 0}
    real = npzmod.write_npy

    def failing(f, a):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real(f, a)

    monkeypatch.setattr(npzmod, "write_npy", failing)
    with pytest.raises(OutputError, match="no space left"):
        save_dump(p, {"a": np.zeros(3), "b": np.zeros(3)}, force=True)
    assert open(p, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["out.npz"]  # no temp file left behind


def test_interrupt_leaves_no_output(tmp_path):
    p = str(tmp_path / "new.npz")
    with pytest.raises(KeyboardInterrupt):
        with atomic_output(p) as tmp:
            open(tmp, "wb").write(b"partial")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_never_overwrites_an_input_even_with_force(tmp_path):
    p = str(tmp_path / "in.npz")
    save_dump(p, {"w": np.ones(1)})
    with pytest.raises(OutputError, match="input"):
        with atomic_output(p, force=True, inputs=[p]):
            pass
    link = str(tmp_path / "alias.npz")
    os.symlink(p, link)
    with pytest.raises(OutputError, match="input"):
        with atomic_output(link, force=True, inputs=[p]):
            pass


def test_target_appearing_during_write_is_not_clobbered(tmp_path):
    p = str(tmp_path / "race.npz")
    with pytest.raises(OutputError, match="appeared"):
        with atomic_output(p) as tmp:
            open(tmp, "wb").write(b"mine")
            open(p, "wb").write(b"theirs")  # another run finished first
    assert open(p, "rb").read() == b"theirs"
    assert os.listdir(tmp_path) == ["race.npz"]
