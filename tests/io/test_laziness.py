"""Opening a dump reads only its index; tensors are read one at a time, on access."""

import numpy as np
import pytest

from gradtool import open_dump, save_dump
from gradtool.io import base


@pytest.mark.parametrize("ext", ["npz", "h5", "safetensors"])
def test_only_one_tensor_resident(tmp_path, ext, monkeypatch):
    p = str(tmp_path / f"big.{ext}")
    save_dump(p, {f"t{i}": np.full(10_000, i, np.float32) for i in range(5)})
    allocations = []
    real = base.allocate
    import gradtool.io.hdf5 as h5mod
    import gradtool.io.npy as npymod
    import gradtool.io.npz as npzmod

    def spy(info, path, **placement):
        allocations.append(info.name)
        return real(info, path, **placement)

    for mod in (base, npymod, npzmod, h5mod):  # where allocate is called (base: DumpReader._read_at)
        monkeypatch.setattr(mod, "allocate", spy)
    with open_dump(p) as r:
        assert allocations == []  # opening read the index only
        import weakref

        alive = []
        for info, a in r.iter_tensors():
            alive.append(weakref.ref(a) if hasattr(a, "__weakref__") else None)
            assert a[0] == int(info.name[1:])
            del a
            # every earlier array has been released: at most the current one is resident
            assert sum(1 for w in alive[:-1] if w is not None and w() is not None) == 0
        assert allocations == [f"t{i}" for i in range(5)]
