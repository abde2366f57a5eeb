"""NpzWriter.add_run: members written whole (CRC and sizes known before the local header) give the same
file, byte for byte, as writing each tensor through zipfile's streaming writer (add_chunks)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gradtool.io.base import TensorInfo
from gradtool.io.deflate import BLOCK
from gradtool.io.npz import NpzWriter

DTYPES = [np.float32, np.float16, np.float64, np.int32, np.uint8]


def _write(path, tensors, compress, whole):
    infos = [TensorInfo(f"layer.{k}/w", a.shape, a.dtype) for k, a in enumerate(tensors)]
    w = NpzWriter(str(path), {"step": 7}, compress=compress)
    if whole:
        w.add_run(infos, np.concatenate([a.reshape(-1).view(np.uint8) for a in tensors] or [np.empty(0, np.uint8)]))
    else:
        for info, a in zip(infos, tensors):
            w.add_chunks(info, iter([a.reshape(-1)]))
    w.close()
    return path.read_bytes()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 40), min_size=0, max_size=3)),
                max_size=12),
       st.booleans(), st.integers(0, 2**32 - 1))
def test_members_written_whole_equal_streamed_members(tmp_path_factory, specs, compress, seed):
    rng = np.random.default_rng(seed)
    tensors = [(rng.standard_normal(int(np.prod(shape))) * 100).astype(dt).reshape(shape) for dt, shape in specs]
    d = tmp_path_factory.mktemp("run")
    whole = _write(d / "whole.npz", tensors, compress, True)
    assert whole == _write(d / "streamed.npz", tensors, compress, False)
    with np.load(d / "whole.npz") as z:
        for k, a in enumerate(tensors):
            got = z[f"layer.{k}/w"]
            assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)


def test_members_of_one_block_are_written_whole_longer_ones_streamed_and_the_file_is_the_same(tmp_path):
    rng = np.random.default_rng(0)
    tensors = [rng.standard_normal(10).astype(np.float32),
               rng.standard_normal(BLOCK // 4 + 100).astype(np.float32),  # deflated the usual way
               rng.standard_normal(BLOCK // 4 - 100).astype(np.float32),  # one block: written whole
               rng.standard_normal(BLOCK // 8).astype(np.float16),
               rng.standard_normal(3).astype(np.float32)]
    for compress in (False, True):
        assert _write(tmp_path / f"w{compress}.npz", tensors, compress, True) == \
            _write(tmp_path / f"s{compress}.npz", tensors, compress, False)


def test_a_member_that_cannot_be_written_stops_the_run_after_the_members_before_it_are_written(tmp_path):
    """The members of a run are written after all are made: one that raises (a dtype npz has no name for)
    must not leave those before it listed in the directory but missing from the file."""
    import pytest

    from gradtool.errors import InputError

    good = [np.arange(5, dtype=np.float32), np.arange(7, dtype=np.float16)]
    for compress in (False, True):
        infos = [TensorInfo(f"t{k}", a.shape, a.dtype) for k, a in enumerate(good)]
        infos.append(TensorInfo("bad", (2,), np.dtype([("a", "<f4")])))  # a structured dtype: no npz name
        data = np.concatenate([a.view(np.uint8) for a in good] + [np.zeros(8, np.uint8)])
        path = tmp_path / f"run{compress}.npz"
        w = NpzWriter(str(path), {}, compress=compress)
        with pytest.raises(InputError, match="bad"):
            w.add_run(infos, data)
        w.close()
        with np.load(path) as z:
            assert sorted(z.files) == ["t0", "t1"]
            for k, a in enumerate(good):
                assert np.array_equal(z[f"t{k}"], a) and z[f"t{k}"].dtype == a.dtype
