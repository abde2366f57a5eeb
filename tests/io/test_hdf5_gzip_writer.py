"""The HDF5 writer's gzip datasets, chunk by chunk (``Hdf5Writer._add_gzip_chunks``: chunks compressed by
gradtool and written with ``write_direct_chunk``): every chunk inflates to the bytes HDF5's own write of
the same array in the same chunks stores (edge chunks padded with zeros), chunks of whole rows or cut
across the trailing axes too, however the tensor's elements arrive."""

import zlib

import h5py
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gradtool.io.base import TensorInfo
from gradtool.io.hdf5 import Hdf5Writer, _guessed_chunks


def _stored_chunks(path, name):
    """Each stored chunk of dataset ``name``, inflated: {chunk offset: bytes}."""
    with h5py.File(path, "r") as f:
        ds = f[name]
        out = {}
        for i in range(ds.id.get_num_chunks()):
            info = ds.id.get_chunk_info(i)
            mask, raw = ds.id.read_direct_chunk(info.chunk_offset)
            assert mask == 0
            out[info.chunk_offset] = zlib.decompress(raw)
        return out


@settings(max_examples=60, deadline=None)
@example(shape=(6000,), dtype="<f4", cut=1000, seed=0)  # (two chunks of whole rows)
@example(shape=(3000, 60), dtype="<f4", cut=4096, seed=1)  # (chunks across the trailing axis too)
@given(shape=st.tuples(st.one_of(st.integers(1, 100), st.integers(1000, 6000)),
                       st.lists(st.integers(1, 60), max_size=2))
       .map(lambda t: (t[0],) + tuple(t[1])).filter(lambda s: np.prod(s) <= 300_000),
       dtype=st.sampled_from(["<f4", "<f2", "<f8", "<i4"]), cut=st.integers(1, 5000), seed=st.integers(0, 2**31))
def test_gzip_chunks_are_the_chunks_hdf5_writes(tmp_path_factory, shape, dtype, cut, seed):
    """(Shapes of up to 300,000 elements: h5py's chunks for them are several, whole rows or not.)"""
    d = tmp_path_factory.mktemp("gz")
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    cshape = _guessed_chunks(shape, a.dtype.itemsize)
    ours, theirs = str(d / "ours.h5"), str(d / "theirs.h5")
    info = TensorInfo("t", shape, a.dtype, compression="gzip", compression_opts=4)
    flat = a.reshape(-1)
    with Hdf5Writer(ours) as w:  # the elements in pieces of ``cut``, as a reader's chunks come
        w.add_chunks(info, iter([flat[i:i + cut] for i in range(0, flat.size, cut)]))
    with h5py.File(theirs, "w") as f:
        f.create_dataset("t", data=a, chunks=cshape, compression="gzip", compression_opts=4)
    with h5py.File(ours, "r") as f:
        assert f["t"].chunks == cshape and f["t"].compression == "gzip"
        assert f["t"][()].tobytes() == a.tobytes()
    assert _stored_chunks(ours, "t") == _stored_chunks(theirs, "t")
